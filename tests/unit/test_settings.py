from __future__ import annotations

import datetime as dt

import pytest

from outbox import ConfigError, RelayConfig, backoff
from outbox.durations import format_duration, parse_duration
from outbox.service.settings import relay_config

S = dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", dt.timedelta(milliseconds=250)),
        ("1s", S),
        ("2m", 120 * S),
        ("1m30s", 90 * S),
        ("1h", 3600 * S),
        ("1.5s", 1.5 * S),
        ("30", 30 * S),
        ("0.5", 0.5 * S),
        (" 2m ", 120 * S),
        ("100us", dt.timedelta(microseconds=100)),
        ("7d", dt.timedelta(days=7)),
    ],
)
def test_durations_parse_go_style_and_plain_seconds(text: str, expected: dt.timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1w", "1m30", "s", "-1s", "1 s", "ms10"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["250ms", "1s", "2m", "1m30s", "1h", "1h0m5s", "100us"])
def test_format_duration_reads_back(text: str) -> None:
    assert parse_duration(format_duration(parse_duration(text))) == parse_duration(text)


def test_backoff_starts_at_one_second_doubles_and_caps_at_five_minutes() -> None:
    waits = [backoff(a) for a in range(-1, 13)]

    assert waits[:3] == [S, S, S]  # attempts -1, 0 and 1
    assert [backoff(a) / S for a in range(1, 10)] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert backoff(10) == 300 * S
    assert backoff(1000) == 300 * S


def test_relay_config_defaults_follow_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INTERVAL", "LEASE", "TIMEOUT", "BATCH", "MAX_ATTEMPTS"):
        monkeypatch.delenv(f"OUTBOX_{name}", raising=False)

    c = relay_config()

    assert (c.interval, c.lease, c.timeout, c.batch, c.max_attempts) == (
        S,
        120 * S,
        30 * S,
        10,
        8,
    )


def test_relay_config_reads_outbox_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_INTERVAL", "250ms")
    monkeypatch.setenv("OUTBOX_LEASE", "1m30s")
    monkeypatch.setenv("OUTBOX_TIMEOUT", "10")
    monkeypatch.setenv("OUTBOX_BATCH", "100")
    monkeypatch.setenv("OUTBOX_MAX_ATTEMPTS", "3")

    c = relay_config()

    assert c.interval == dt.timedelta(milliseconds=250)
    assert c.lease == 90 * S
    assert c.timeout == 10 * S
    assert (c.batch, c.max_attempts) == (100, 3)


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        ("OUTBOX_INTERVAL", "soon", "not a duration"),
        ("OUTBOX_INTERVAL", "0s", "greater than"),
        ("OUTBOX_TIMEOUT", "-5s", "not a duration"),
        ("OUTBOX_BATCH", "many", "integer"),
        ("OUTBOX_BATCH", "0", "greater than or equal to 1"),
        ("OUTBOX_MAX_ATTEMPTS", "0", "greater than or equal to 1"),
        ("OUTBOX_LEASE", "20s", "must outlast OUTBOX_TIMEOUT"),
    ],
)
def test_bad_values_name_their_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, complaint: str
) -> None:
    monkeypatch.setenv(variable, value)

    with pytest.raises(ConfigError) as info:
        relay_config()

    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
    assert complaint in str(info.value)


def test_lease_must_outlast_timeout_in_code_too() -> None:
    with pytest.raises(ValueError, match="must outlast OUTBOX_TIMEOUT"):
        RelayConfig.model_validate({"lease": "30s", "timeout": "30s"})


def test_a_config_built_in_code_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_BATCH", "77")
    monkeypatch.setenv("OUTBOX_LEASE", "not a duration")

    built = RelayConfig(batch=50)

    assert built.batch == 50
    assert built.lease == dt.timedelta(minutes=2)
    assert RelayConfig().batch == 10
    with pytest.raises(ConfigError, match=r"^OUTBOX_LEASE: "):
        relay_config()
    monkeypatch.delenv("OUTBOX_LEASE")
    assert relay_config().batch == 77
    assert relay_config(batch=5).batch == 5


def test_a_smtp_password_in_clear_text_is_refused_unless_on_loopback() -> None:
    from outbox.errors import ConfigError
    from outbox.service.settings import SmtpSettings, load

    with pytest.raises(ConfigError, match="OUTBOX_SMTP_TLS: none would send") as caught:
        load(SmtpSettings, host="mail.example.com", tls="none", password="Sup3rS3cret")
    assert "Sup3rS3cret" not in str(caught.value)

    assert load(SmtpSettings, host="127.0.0.1", tls="none", password="x").tls == "none"
    assert load(SmtpSettings, host="mail.example.com", tls="none").tls == "none"
