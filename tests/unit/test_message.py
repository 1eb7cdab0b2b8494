from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest
from pydantic import BaseModel

from outbox import EncodeError, Message, PayloadMismatch, Permanent, new_message

NOW = dt.datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=dt.UTC)


class Link(BaseModel):
    to: str
    expires: dt.datetime


@dataclasses.dataclass
class Change:
    user: uuid.UUID
    amount: Decimal


def test_payload_is_compact_utf8_json() -> None:
    m = new_message("orders.placed", {"to": "zoë@example.com", "n": [1, 2]}, NOW)

    assert m.payload == '{"to":"zoë@example.com","n":[1,2]}'.encode()
    assert m.json() == {"to": "zoë@example.com", "n": [1, 2]}


def test_pydantic_models_and_dataclasses_are_encoded() -> None:
    user = uuid.UUID("12345678-1234-5678-1234-567812345678")
    m1 = new_message("a", Link(to="x@example.com", expires=NOW), NOW)
    m2 = new_message("a", {"change": Change(user, Decimal("1.50"))}, NOW)

    assert json.loads(m1.payload) == {
        "to": "x@example.com",
        "expires": "2026-03-04T05:06:07.891234Z",
    }
    assert json.loads(m2.payload) == {"change": {"user": str(user), "amount": "1.50"}}


@pytest.mark.parametrize("payload", [None, 3, "text", 1.5, True, []])
def test_scalars_and_lists_are_payloads(payload: object) -> None:
    assert new_message("a", payload, NOW).json() == payload


def test_id_is_uuid7_and_unique() -> None:
    a, b = new_message("a", {}, NOW), new_message("a", {}, NOW)

    assert isinstance(a.id, uuid.UUID)
    assert a.id.version == 7
    assert a.id != b.id


def test_created_at_is_utc_truncated_to_milliseconds() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    m = new_message("a", {}, NOW.astimezone(plus_two))

    assert m.created_at == dt.datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=dt.UTC)
    assert m.created_at.tzinfo is dt.UTC
    assert m.attempts == 0


@pytest.mark.parametrize(
    "payload",
    [{"s": {1, 2}}, {"b": b"bytes"}, float("nan"), {"x": object()}],
)
def test_unencodable_payload_raises_encode_error(payload: object) -> None:
    with pytest.raises(EncodeError) as info:
        new_message("orders.placed", payload, NOW)

    assert str(info.value).startswith("outbox: encode orders.placed:")
    assert isinstance(info.value, ValueError)


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        new_message("a", {}, dt.datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("topic", "complaint"),
    [
        ("", "must not be empty"),
        ("Mail", "must match"),
        ("-mail", "must match"),
        ("mail link", "must match"),
        ("mail/link", "must match"),
        ("a" * 201, "at most 200"),
    ],
)
def test_bad_topics_are_refused(topic: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        new_message(topic, {}, NOW)


@pytest.mark.parametrize("topic", ["a", "orders.placed", "0-x_y.z", "a" * 200])
def test_good_topics_are_accepted(topic: str) -> None:
    assert new_message(topic, {}, NOW).topic == topic


def test_message_is_frozen() -> None:
    m = new_message("a", {}, NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.attempts = 3  # type: ignore[misc]
    assert isinstance(m, Message)


def test_now_defaults_to_the_current_time_in_utc() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    m = new_message("orders.placed", {"n": 1})
    assert before <= m.created_at <= dt.datetime.now(dt.UTC)
    assert m.created_at.tzinfo == dt.UTC
    assert m.deliver_at is None


def test_deliver_at_is_kept_in_utc_and_must_be_aware() -> None:
    later = dt.datetime(2026, 6, 1, 12, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    m = new_message("orders.placed", {}, deliver_at=later)
    assert m.deliver_at == dt.datetime(2026, 6, 1, 10, 0, 0, 123000, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="deliver_at must be timezone-aware"):
        new_message("orders.placed", {}, deliver_at=dt.datetime(2026, 6, 1))


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        ({"note": "a\x00b"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        (["ok", {"deep": ["x\x00"]}], "NUL"),
        ({1: "a", "1": "b"}, "key '1' appears twice"),
        ({"n": float("nan")}, "NaN|Out of range"),
    ],
)
def test_what_would_break_later_is_refused_now(payload: object, complaint: str) -> None:
    with pytest.raises(EncodeError, match=complaint):
        new_message("orders.placed", payload)


class Order(BaseModel):
    order: uuid.UUID
    total: Decimal
    at: dt.datetime


@dataclasses.dataclass
class Ping:
    n: int
    note: str = ""


def test_decode_gives_typed_payloads() -> None:
    order = Order(
        order=uuid.uuid4(), total=Decimal("9.50"), at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    )
    assert new_message("orders.placed", order).decode(Order) == order
    assert new_message("ping", Ping(3, "x")).decode(Ping) == Ping(3, "x")


@pytest.mark.parametrize(
    ("payload", "model"),
    [
        ({"order": "not-a-uuid", "total": 1, "at": "2026-01-01T00:00:00Z"}, Order),
        ([1, 2], Ping),
        ({"m": 1}, Ping),
    ],
)
def test_a_payload_that_does_not_fit_is_a_permanent_error(payload: object, model: type) -> None:
    m = new_message("orders.placed", payload)

    with pytest.raises(
        PayloadMismatch, match=f"payload of orders.placed does not fit {model.__name__}"
    ):
        m.decode(model)
    assert issubclass(PayloadMismatch, Permanent)


def test_a_payload_over_the_limit_is_refused_on_add(
    monkeypatch: pytest.MonkeyPatch, max_payload: Callable[[str], None]
) -> None:
    from outbox import ConfigError
    from outbox.message import MAX_PAYLOAD, check_message

    big = {"blob": "x" * MAX_PAYLOAD}
    with pytest.raises(EncodeError, match="OUTBOX_MAX_PAYLOAD allows 1048576"):
        new_message("files.uploaded", big)

    max_payload("4MiB")
    m = new_message("files.uploaded", big)
    max_payload("64KiB")
    with pytest.raises(ValueError, match="OUTBOX_MAX_PAYLOAD allows 65536"):
        check_message(m)
    max_payload("lots")
    with pytest.raises(ConfigError, match="OUTBOX_MAX_PAYLOAD"):
        new_message("files.uploaded", {})


def test_the_payload_limit_is_read_once_a_process(
    monkeypatch: pytest.MonkeyPatch, max_payload: Callable[[str], None]
) -> None:
    max_payload("64KiB")
    new_message("files.uploaded", {})  # the first message reads it

    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD", "lots")  # not read again
    with pytest.raises(EncodeError, match="OUTBOX_MAX_PAYLOAD allows 65536"):
        new_message("files.uploaded", {"blob": "x" * 70_000})


def test_a_hand_built_message_nested_too_deep_is_a_value_error() -> None:
    from outbox.message import check_message

    m = new_message("orders.placed", {})
    deep = dataclasses.replace(m, payload=b"[" * 5000 + b"]" * 5000)
    with pytest.raises(ValueError, match="payload of"):
        check_message(deep)


def test_a_message_changed_after_new_message_is_checked_whole() -> None:
    from outbox.message import check_message

    m = new_message("orders.placed", {"n": 1}, NOW, headers={"x-tenant": "a"})
    assert check_message(m) is m
    # replace() makes a message new_message did not: every field is checked again.
    for changed, why in (
        (dataclasses.replace(m, payload=b'{"n": NaN}'), "not a JSON number"),
        (dataclasses.replace(m, payload=b'{"n": 1, "n": 2}'), "appears twice"),
        (dataclasses.replace(m, topic="Orders Placed"), "must match"),
        (dataclasses.replace(m, created_at=NOW.replace(tzinfo=None)), "timezone-aware"),
    ):
        with pytest.raises(ValueError, match=why):
            check_message(changed)
    # Its headers are a mapping anyone may change: checked on every add.
    m.headers["X-Tenant"] = "b"  # type: ignore[index]
    with pytest.raises(ValueError, match="headers of"):
        check_message(m)


def test_what_new_message_made_compares_as_a_message_built_by_hand() -> None:
    m = new_message("orders.placed", {"n": 1}, NOW)
    by_hand = Message(id=m.id, topic=m.topic, payload=m.payload, created_at=m.created_at)
    assert m == by_hand
    assert repr(m) == repr(by_hand)
