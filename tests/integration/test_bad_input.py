"""Bad input, as a new operator or developer gives it: one clear line, the right exit, no change.

Every case runs against a migrated database holding a pending message, a
buried one and a topic entry; afterwards the outbox tables are byte for byte
what they were. Configuration and usage errors exit 2, runtime errors 1; the
line names the variable or argument at fault.
"""

from __future__ import annotations

import datetime as dt
import re
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from outbox import Message, NotInTransaction, new_message
from outbox.postgres import PostgresStore, add_sync, connect_pool, migrate
from outbox.store import TopicSettings
from tests.conftest import fresh_schema
from tests.integration.process import run_outbox, run_outbox_here

pytestmark = pytest.mark.postgres_only

NOW = dt.datetime.now(dt.UTC)
TABLES = ("outbox_messages", "outbox_topics", "outbox_relays")
RELAY = {"OUTBOX_LOG_TOPICS": "orders.placed"}  # a relay that would start, but for the case
SMTP = {**RELAY, "OUTBOX_SMTP_HOST": "127.0.0.1"}
HUGE = "9" * 400


@pytest.fixture(scope="module")
def seeded(postgres_url: str) -> Iterator[str]:
    """A migrated schema with a pending message, a buried one and a topic entry."""
    with fresh_schema(postgres_url) as conninfo:

        async def seed() -> None:
            await migrate(conninfo)
            async with connect_pool(conninfo, max_size=1) as pool:
                store = PostgresStore(pool)
                pending = new_message("orders.placed", {"n": 1}, NOW)
                doomed = new_message("orders.placed", {"n": 2}, NOW)
                async with store.begin() as tx:
                    await store.add(tx, pending, doomed)
                held = {m.id: m for m in await store.claim(NOW, dt.timedelta(minutes=1), 10)}
                await store.bury(doomed.id, "RuntimeError: kept for the operator", at=NOW)
                await store.release([held[pending.id]], now=NOW)
                await store.set_topic(TopicSettings("orders.placed", max_attempts=5), NOW)

        anyio.run(seed)
        yield conninfo


def snapshot(conninfo: str) -> dict[str, str]:
    """Each outbox table's rows, as one digest a table."""
    with psycopg.connect(conninfo) as conn:
        return {
            table: str(
                conn.execute(
                    sql.SQL(
                        "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
                        "FROM {} AS t"
                    ).format(sql.Identifier(table))
                ).fetchone()
            )
            for table in TABLES
        }


ID = str(uuid.UUID(int=7))
CLI = [
    # -- environment variables, read by `outbox relay` before it starts anything
    (
        ("relay",),
        {**RELAY, "OUTBOX_LEASE": "99999999999d"},
        2,
        "OUTBOX_LEASE: '99999999999d' is too long",
    ),
    (("relay",), {**RELAY, "OUTBOX_LEASE": "3000000d"}, 2, "OUTBOX_LEASE: '3000000d' is too long"),
    (("relay",), {**RELAY, "OUTBOX_LEASE": "40d"}, 2, "OUTBOX_LEASE: "),
    (("relay",), {**RELAY, "OUTBOX_TIMEOUT": HUGE + "s"}, 2, "OUTBOX_TIMEOUT: '9999"),
    (("relay",), {**RELAY, "OUTBOX_TIMEOUT": "5m"}, 2, "OUTBOX_LEASE: must outlast OUTBOX_TIMEOUT"),
    (
        ("relay",),
        {**RELAY, "OUTBOX_INTERVAL": "soon"},
        2,
        "OUTBOX_INTERVAL: 'soon' is not a duration",
    ),
    (("relay",), {**RELAY, "OUTBOX_INTERVAL": "0s"}, 2, "OUTBOX_INTERVAL: "),
    (("relay",), {**RELAY, "OUTBOX_BATCH": "0"}, 2, "OUTBOX_BATCH: "),
    (("relay",), {**RELAY, "OUTBOX_BATCH": "lots"}, 2, "OUTBOX_BATCH: "),
    (("relay",), {**RELAY, "OUTBOX_MAX_ATTEMPTS": "0"}, 2, "OUTBOX_MAX_ATTEMPTS: "),
    (("relay",), {**RELAY, "OUTBOX_UNSERVED_GRACE": "forever"}, 2, "OUTBOX_UNSERVED_GRACE: "),
    (("relay",), {**RELAY, "OUTBOX_HTTP_PORT": "70000"}, 2, "OUTBOX_HTTP_PORT: "),
    (("relay",), {**RELAY, "OUTBOX_HTTP_PORT": "http"}, 2, "OUTBOX_HTTP_PORT: "),
    (("relay",), {**RELAY, "OUTBOX_LOG_LEVEL": "loud"}, 2, "OUTBOX_LOG_LEVEL: "),
    (("relay",), {**RELAY, "OUTBOX_LOG_FORMAT": "xml"}, 2, "OUTBOX_LOG_FORMAT: "),
    (("relay",), {"OUTBOX_LOG_TOPICS": "Bad Topic"}, 2, "OUTBOX_LOG_TOPICS: "),
    (("relay",), {"OUTBOX_HANDLERS": "no-colon"}, 2, "OUTBOX_HANDLERS: "),
    (("relay",), {"OUTBOX_HANDLERS": "tests.nowhere:handlers"}, 2, "OUTBOX_HANDLERS: "),
    (
        ("relay",),
        {"OUTBOX_HANDLERS": "tests.integration.recording:broken_handlers"},
        2,
        "OUTBOX_HANDLERS: tests.integration.recording:broken_handlers raised",
    ),
    (
        ("relay",),
        {"OUTBOX_HANDLERS": "tests.integration.recording:misnamed_handlers"},
        2,
        "OUTBOX_HANDLERS: tests.integration.recording:misnamed_handlers maps a bad topic",
    ),
    (("relay",), {**SMTP, "OUTBOX_SMTP_TLS": "ssl"}, 2, "OUTBOX_SMTP_TLS: "),
    (("relay",), {**SMTP, "OUTBOX_SMTP_PORT": "-1"}, 2, "OUTBOX_SMTP_PORT: "),
    (
        ("relay",),
        {**SMTP, "OUTBOX_SMTP_CA_FILE": "/nonexistent/ca.pem"},
        2,
        "OUTBOX_SMTP_CA_FILE: ",
    ),
    (("relay",), {**SMTP, "OUTBOX_SMTP_FROM_ADDRESS": "nobody"}, 2, "OUTBOX_SMTP_FROM_ADDRESS: "),
    (("relay",), {**SMTP, "OUTBOX_SMTP_TIMEOUT": "-3s"}, 2, "OUTBOX_SMTP_TIMEOUT: "),
    (("relay",), {**RELAY, "OUTBOX_NATS_URL": "notaurl"}, 2, "OUTBOX_NATS_URL: 'notaurl'"),
    (
        ("relay",),
        {**RELAY, "OUTBOX_NATS_CREDS_FILE": "/nonexistent.creds"},
        2,
        "OUTBOX_NATS_CREDS_FILE",
    ),
    (("relay",), {**RELAY, "OUTBOX_WEBHOOK_ALLOW": "10.0.0.0/8"}, 2, "OUTBOX_WEBHOOK_ALLOW: "),
    (("controller",), {"OUTBOX_LEASE": "1s"}, 2, "OUTBOX_LEASE: "),
    # -- usage of every subcommand
    (("bogus",), {}, 2, "invalid choice: 'bogus'"),
    (("relay", "--bogus"), {}, 2, "unrecognized arguments: --bogus"),
    (("migrate", "--bogus"), {}, 2, "unrecognized arguments: --bogus"),
    (("env", "--output", "xml"), {}, 2, "--output"),
    (("relays", "--output", "yaml"), {}, 2, "argument --output: invalid choice: 'yaml'"),
    (("buried", "list", "--limit", "-5"), {}, 2, "argument --limit: must be at least 1"),
    (
        ("buried", "list", "--since", "999999999d"),
        {},
        2,
        "argument --since: '999999999d' is too long",
    ),
    (("buried", "list", "--since", "yesterday"), {}, 2, "argument --since: 'yesterday' is not"),
    (("buried", "list", "--topic", "Bad Topic"), {}, 2, "must match"),
    (("buried", "show"), {}, 2, "the following arguments are required: id"),
    (("buried", "show", "not-a-uuid"), {}, 2, "is not a message id"),
    (("buried", "show", ID), {}, 2, "not found"),
    (("buried", "requeue"), {}, 2, "or --all (alone)"),
    (("buried", "requeue", "--all", "--topic", "orders.placed"), {}, 2, "or --all (alone)"),
    (("buried", "requeue", ID), {}, 2, "not found"),
    (("buried", "purge"), {}, 2, "--older-than"),
    (("buried", "purge", "--older-than", "3000000d", "--yes"), {}, 2, "is too long"),
    (("topics", "list", "--output", "yaml"), {}, 2, "invalid choice: 'yaml'"),
    (("topics", "set"), {}, 2, "the following arguments are required: topic"),
    (
        ("topics", "set", "x", "--timeout", "0s"),
        {},
        2,
        "argument --timeout: must be longer than 0s",
    ),
    (("topics", "set", "x", "--timeout", "9999999999d"), {}, 2, "argument --timeout: "),
    (("topics", "set", "mail.login_link", "--timeout", "5m"), {}, 2, "5m does not stay below"),
    (
        ("topics", "set", "x", "--max-attempts", "0"),
        {},
        2,
        "argument --max-attempts: must be at least 1",
    ),
    (("topics", "set", "x", "--max-attempts", "99999999999"), {}, 2, "must be at most 1000"),
    (("topics", "set", "x", "--max-in-flight", "many"), {}, 2, "'many' is not a whole number"),
    (("topics", "set", "x", "--enabled", "--paused"), {}, 2, "not allowed with argument --enabled"),
    (("topics", "pause", "Bad Topic"), {}, 2, "must match"),
    (("topics", "delete", "Bad Topic"), {}, 2, "must match"),
    # -- OutboxTopic specs, as `outbox topics set` writes them
    (("topics", "set", "x", "--config", "[1]"), {}, 2, "must be a JSON object"),
    (("topics", "set", "x", "--config", '{"a": NaN}'), {}, 2, "NaN is not a JSON number"),
    (("topics", "set", "x", "--config", '{"a": "\\u0000"}'), {}, 2, "a NUL character"),
    (("topics", "set", "x", "--config", '{"a": 1, "a": 2}'), {}, 2, "key 'a' appears twice"),
    (("topics", "set", "x", "--config", "{"), {}, 2, "argument --config: "),
    (
        ("topics", "set", "x", "--handler", "no-such-kind"),
        {},
        2,
        "--handler: 'no-such-kind' is unknown",
    ),
    (
        ("topics", "set", "x", "--handler", "webhook", "--config", '{"url": 5}'),
        {},
        2,
        "--config: for handler webhook: url: ",
    ),
    (
        ("topics", "set", "x", "--handler", "webhook", "--config", '{"url": "ftp://h/x"}'),
        {},
        2,
        "--config: for handler webhook: url: ",
    ),
    (
        (
            "topics",
            "set",
            "x",
            "--handler",
            "webhook",
            "--config",
            '{"url": "https://a.example/", "x": 1}',
        ),
        {},
        2,
        "--config: for handler webhook: x: Extra inputs are not permitted",
    ),
    (
        (
            "topics",
            "set",
            "x",
            "--handler",
            "webhook",
            "--config",
            '{"url": "https://evil.example/"}',
        ),
        {"OUTBOX_WEBHOOK_ALLOW": "https://billing.internal/"},
        2,
        "is not under OUTBOX_WEBHOOK_ALLOW",
    ),
    (
        ("topics", "set", "x", "--handler", "nats", "--config", "{}"),
        {},
        2,
        "for handler nats: subject: ",
    ),
    *(
        (
            ("topics", "set", "x", "--handler", "webhook", "--config", config),
            {"OUTBOX_WEBHOOK_ALLOW": "https://billing.internal/"},
            2,
            complaint,
        )
        for config, complaint in [
            (
                '{"url": "https://billing.internal/h", "secret_env": "OUTBOX_DATABASE_URL"}',
                "secret_env: String should match pattern",
            ),
            (
                '{"url": "https://billing.internal/h", "headers": {"Content-Length": "0"}}',
                "header Content-Length is reserved",
            ),
            (
                '{"url": "https://billing.internal/h", "headers": {"Authorization ": "x"}}',
                "not an HTTP token",
            ),
            ('{"url": "https://u:p@billing.internal/h"}', "must not carry credentials"),
            (
                '{"url": "https://billing.internal.evil.example/h"}',
                "not under OUTBOX_WEBHOOK_ALLOW",
            ),
        ]
    ),
    (
        ("topics", "set", "x", "--handler", "nats", "--config", '{"subject": "$KV.flags.x"}'),
        {},
        2,
        "the server's own",
    ),
    (
        ("topics", "set", "x", "--handler", "log", "--config", '{"level": 3}'),
        {},
        2,
        "for handler log",
    ),
]


def _id(case: tuple[tuple[str, ...], dict[str, str], int, str]) -> str:
    args, env, _, _ = case
    return " ".join([*args[:3], *(f"{k}={v[:12]}" for k, v in env.items() if k not in RELAY)])


def prog(args: tuple[str, ...]) -> str:
    """The command a line names: as far as the arguments name a known command."""
    words = ["outbox"]
    for arg in args[:2]:
        if arg.startswith("-") or (len(words) == 1 and arg not in COMMANDS):
            break
        words.append(arg)
    return " ".join(words)


COMMANDS = {"relay", "migrate", "controller", "buried", "topics", "relays", "env"}


def _first_of_each_command() -> list[tuple[tuple[str, ...], dict[str, str], int, str]]:
    """A case of each command (and of each subcommand), to run as a real process."""
    seen: dict[str, Any] = {}
    for case in CLI:
        seen.setdefault(" ".join(case[0][:2]), case)
    return list(seen.values())


REAL = _first_of_each_command()


@pytest.mark.parametrize(("args", "env", "code", "line"), CLI, ids=[_id(c) for c in CLI])
def test_the_command_line_says_what_is_wrong_in_one_line(
    seeded: str, args: tuple[str, ...], env: dict[str, str], code: int, line: str
) -> None:
    says_in_one_line(seeded, run_outbox_here, args, env, code, line)


@pytest.mark.parametrize(("args", "env", "code", "line"), REAL, ids=[_id(c) for c in REAL])
def test_a_real_outbox_process_says_it_in_one_line_too(
    seeded: str, args: tuple[str, ...], env: dict[str, str], code: int, line: str
) -> None:
    # The cases above run in this process; one of each command runs as the
    # console script a user starts, so nothing differs between the two.
    says_in_one_line(seeded, run_outbox, args, env, code, line)


def says_in_one_line(
    seeded: str,
    run: Callable[..., subprocess.CompletedProcess[str]],
    args: tuple[str, ...],
    env: dict[str, str],
    code: int,
    line: str,
) -> None:
    """``outbox ARGS``, run by ``run``, exits ``code`` with one line naming the command
    and holding ``line``, prints nothing else and changes nothing."""
    before = snapshot(seeded)

    result = run(*args, OUTBOX_DATABASE_URL=seeded, **env)

    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog(args)}: ")
    assert line in lines[0]
    assert snapshot(seeded) == before


def test_an_unmigrated_database_is_one_line_asking_for_migrate(postgres_url: str) -> None:
    with fresh_schema(postgres_url) as empty:
        for args in (("buried", "requeue", "--topic", "x"), ("topics", "list"), ("relays",)):
            result = run_outbox(*args, OUTBOX_DATABASE_URL=empty)

            assert result.returncode == 1
            assert result.stderr.strip().splitlines() == [
                f"outbox {' '.join(args[:2]) if args[0] != 'relays' else 'relays'}: "
                "OUTBOX_DATABASE_URL: the outbox schema is missing or out of date: "
                "run `outbox migrate`"
            ]


def test_an_http_port_in_use_is_one_line_exit_1(seeded: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_outbox(
            "relay",
            OUTBOX_DATABASE_URL=seeded,
            OUTBOX_HTTP_HOST="127.0.0.1",
            OUTBOX_HTTP_PORT=str(port),
            **RELAY,
        )

    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"outbox relay: OUTBOX_HTTP_PORT: cannot listen on 127.0.0.1:{port}: ")
    assert line.endswith("address already in use")


# -- the producer API ------------------------------------------------------------------------


def _built(**fields: Any) -> Message:
    """A Message built by hand, not by new_message."""
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "topic": "orders.placed",
        "payload": b"{}",
        "created_at": NOW,
        **fields,
    }
    return Message(**values)


def _new(*args: Any, **kwargs: Any) -> Callable[[], Message]:
    return lambda: new_message(*args, **kwargs)


API: list[tuple[str, Callable[[], Message], type[Exception], str]] = [
    ("bad topic", _new("Bad Topic", {}, NOW), ValueError, "topic 'Bad Topic' must match"),
    ("empty topic", _new("", {}, NOW), ValueError, "topic must not be empty"),
    ("long topic", _new("a" * 300, {}, NOW), ValueError, "at most 200"),
    ("keys that collide", _new("t", {1: "a", "1": "b"}, NOW), ValueError, "appears twice"),
    ("NaN", _new("t", {"a": float("nan")}, NOW), ValueError, "not JSON compliant"),
    ("infinity", _new("t", [float("inf")], NOW), ValueError, "not JSON compliant"),
    ("NUL", _new("t", {"a": "\x00"}, NOW), ValueError, "a NUL character"),
    ("an object", _new("t", {"a": object()}, NOW), ValueError, "not JSON serializable"),
    ("naive now", _new("t", {}, dt.datetime(2026, 1, 1)), ValueError, "now must be timezone-aware"),
    (
        "naive deliver_at",
        _new("t", {}, NOW, deliver_at=dt.datetime(2026, 1, 1)),
        ValueError,
        "deliver_at must be timezone-aware",
    ),
]
BUILT: list[tuple[str, Message, str]] = [
    ("a bad topic", _built(topic="Bad Topic"), "topic 'Bad Topic' must match"),
    ("bytes that are not JSON", _built(payload=b"\xff{"), "payload"),
    ("keys that collide", _built(payload=b'{"a": 1, "a": 2}'), "appears twice"),
    ("NUL", _built(payload=b'{"a": "\\u0000"}'), "a NUL character"),
    ("NaN", _built(payload=b'{"a": NaN}'), "NaN"),
    ("naive created_at", _built(created_at=dt.datetime(2026, 1, 1)), "timezone-aware"),
]


@pytest.mark.parametrize(("make", "error", "text"), [c[1:] for c in API], ids=[c[0] for c in API])
def test_new_message_refuses_in_one_line(
    make: Callable[[], Message], error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as raised:
        make()

    assert len(str(raised.value).splitlines()) == 1
    assert text in str(raised.value)


@pytest.mark.parametrize(("bad", "text"), [c[1:] for c in BUILT], ids=[c[0] for c in BUILT])
def test_every_producer_refuses_a_hand_built_message_and_stores_nothing(
    seeded: str, bad: Message, text: str
) -> None:
    before = snapshot(seeded)
    good = new_message("orders.placed", {"n": 3}, NOW)

    with (
        psycopg.connect(seeded) as conn,
        pytest.raises(ValueError, match=re.escape(text)) as raised,
        conn.transaction(),
    ):
        add_sync(conn, good, bad)

    async def through_the_store() -> None:
        async with connect_pool(seeded, max_size=1) as pool:
            store = PostgresStore(pool)
            async with store.begin() as tx:
                await store.add(tx, bad)

    with pytest.raises(ValueError, match=re.escape(text)) as again:
        anyio.run(through_the_store)

    for exc in (raised.value, again.value):
        assert len(str(exc).splitlines()) == 1
    assert snapshot(seeded) == before


def test_outside_a_transaction_nothing_is_stored(seeded: str) -> None:
    before = snapshot(seeded)

    with psycopg.connect(seeded, autocommit=True) as conn, pytest.raises(NotInTransaction):
        add_sync(conn, new_message("orders.placed", {"n": 4}, NOW))

    assert snapshot(seeded) == before
