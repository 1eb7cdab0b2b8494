"""The operator console's API (`outbox ui`) against a real PostgreSQL: served on
loopback by aiohttp in this process, and as the real command where it
matters (what it refuses to start with, what it serves)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from outbox import Message, new_message
from outbox.postgres import PostgresStore, connect_pool
from outbox.service.ui import Console, TokenFile
from outbox.service.ui.api import MAX_BODY
from outbox.service.ui.inputs import MAX_IDS
from tests.clock import T0
from tests.integration import recording
from tests.integration.process import (
    REPO,
    RelayProcess,
    count,
    free_port,
    outbox_env,
    run_outbox,
    wait_until,
)

VIEWER = "viewer-token-0123456789"
OPERATOR = "operator-token-0123456789"
LEASE = dt.timedelta(minutes=2)


def tokens_file(path: Path) -> Path:
    path.write_text(f"# the console's tokens\nana viewer {VIEWER}\nolu operator {OPERATOR}\n")
    return path


class Client:
    """Requests to a served console, each with ``token`` (None: no credentials)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def get(self, path: str, token: str | None = None) -> tuple[int, Any]:
        async with self.session.get(self.base + path, headers=_auth(token)) as r:
            return r.status, await r.json()

    async def post(self, path: str, body: Any, token: str | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(self.base + path, data=data, headers=_auth(token)) as r:
            return r.status, await r.json()


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def console(pg_store: PostgresStore, tmp_path: Path) -> AsyncIterator[Client]:
    app = Console(pg_store, TokenFile(tokens_file(tmp_path / "tokens"))).app()
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        yield Client(session, str(server.make_url("")).rstrip("/"))


async def bury(store: PostgresStore, *msgs: Message, reason: str) -> None:
    async with store.begin() as tx:
        await store.add(tx, *msgs)
    for m in msgs:
        await store.bury(m.id, reason, at=T0)


async def test_without_a_token_nothing_is_answered_and_a_viewer_reads_but_never_changes(
    console: Client, pg_store: PostgresStore
) -> None:
    await bury(pg_store, new_message("mail.welcome", {"code": "918273"}, T0), reason="550 gone")

    assert (await console.get("/api/v1/topics"))[0] == 401
    assert (await console.get("/api/v1/topics", "not-a-token-at-all"))[0] == 401
    status, topics = await console.get("/api/v1/topics", VIEWER)
    assert status == 200
    [welcome] = topics
    assert (welcome["topic"], welcome["buried"], welcome["pending"]) == ("mail.welcome", 1, 0)
    assert "918273" not in json.dumps(topics), "no payload in what a viewer reads"

    body = {"filter": {"topic": "mail.welcome"}, "dry_run": True}
    status, answer = await console.post("/api/v1/buried/requeue", body, VIEWER)
    assert status == 403
    assert "operator" in answer["error"]
    assert (await console.post("/api/v1/buried/purge", body))[0] == 401
    assert len(await pg_store.list_buried()) == 1, "nothing changed"


async def test_a_dry_run_counts_what_the_action_then_requeues_and_the_audit_line_says_who(
    console: Client, pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    timeouts = [new_message("hook.order", {"n": n}, T0, key="order-7") for n in range(3)]
    await bury(pg_store, *timeouts, reason="receiver said: SECRET-TIMEOUT-7")
    rejected = new_message("hook.order", {"n": 9}, T0)
    await bury(pg_store, rejected, reason="400 bad request")
    wanted = {"topic": "hook.order", "error_contains": "secret-timeout"}

    status, dry = await console.post(
        "/api/v1/buried/requeue", {"filter": wanted, "dry_run": True}, OPERATOR
    )
    assert (status, dry["count"]) == (200, 3)
    assert dry["as_of"] is not None
    with caplog.at_level(logging.INFO, logger="outbox.ui.audit"):
        status, done = await console.post(
            "/api/v1/buried/requeue", {"filter": {**wanted, "buried_by": dry["as_of"]}}, OPERATOR
        )
    assert (status, done) == (200, {"count": 3})
    [left] = await pg_store.list_buried()
    assert left.message.id == rejected.id, "only what the filter selected was requeued"

    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.ui.audit"]
    assert line.startswith("olu (operator) requeue: topic=hook.order")
    assert "filter=buried_by,error_contains,topic count=3" in line
    assert "timeout" not in line.lower(), "not the error text searched for"
    assert "order-7" not in line, "no key in the audit log"

    # The key's requeued messages go out in their order.
    claimed = await pg_store.claim(None, LEASE, 10)
    assert [m.id for m in claimed] == [timeouts[0].id]


async def test_filters_are_checked_and_bounded(console: Client) -> None:
    refusals = [
        ({"filter": {}}, 400, "empty filter"),
        ({"dry_run": True}, 400, "give a filter"),
        ({"filter": {"all": True, "topic": "a.b"}}, 400, "alone"),
        ({"filter": {"topic": "Not A Topic"}}, 400, "topic"),
        ({"filter": {"colour": "red"}}, 400, "unknown filter fields: colour"),
        ({"filter": {"older_than": "soon"}}, 400, "older_than"),
        ({"filter": {"error_contains": "x" * 201}}, 400, "error_contains"),
        ({"filter": {"ids": ["nope"]}}, 400, "UUIDs"),
        ({"filter": {"ids": [str(uuid.uuid4())] * (MAX_IDS + 1)}}, 413, "at most"),
        ({"filter": {"all": True}, "dry_run": "yes"}, 400, "dry_run"),
    ]
    for body, status, says in refusals:
        got, answer = await console.post("/api/v1/buried/purge", body, OPERATOR)
        assert (got, says in answer["error"]) == (status, True), (body, answer)
    got, answer = await console.post("/api/v1/buried/purge", b"x" * (MAX_BODY + 1), OPERATOR)
    assert got == 413
    got, answer = await console.post("/api/v1/buried/purge", b"[1]", OPERATOR)
    assert (got, answer["error"]) == (400, "the body must be a JSON object")
    status, everything = await console.post(
        "/api/v1/buried/purge", {"filter": {"all": True}, "dry_run": True}, OPERATOR
    )
    assert (status, everything) == (200, {"count": 0, "as_of": None})
    assert (await console.get("/api/v1/keys/blocked?limit=501", VIEWER))[0] == 400


async def test_a_rotated_tokens_file_is_read_again(pg_store: PostgresStore, tmp_path: Path) -> None:
    path = tokens_file(tmp_path / "tokens")
    tokens = TokenFile(path)
    assert tokens.who(VIEWER) is not None
    path.write_text(f"ana viewer {'rotated-viewer-token-0001'}\n")
    assert tokens.who(VIEWER) is None, "the old token stops working"
    assert tokens.who("rotated-viewer-token-0001") is not None
    path.write_text("ana admin short\n")  # a bad edit keeps the tokens read before
    assert tokens.who("rotated-viewer-token-0001") is not None


def test_the_command_refuses_to_serve_beyond_loopback_without_authentication(db: str) -> None:
    result = run_outbox("ui", OUTBOX_DATABASE_URL=db, OUTBOX_UI_HOST="0.0.0.0")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("outbox ui: OUTBOX_UI_HOST: 0.0.0.0 is beyond loopback")


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        ({"OUTBOX_UI_PROXY_ADDRESSES": "10.0.0.0/8,the office"}, "OUTBOX_UI_PROXY_ADDRESSES"),
        ({"OUTBOX_UI_PROXY_ADDRESSES": "10.0.0.0/8"}, "OUTBOX_UI_PROXY_VIEWER_GROUPS"),
        ({"OUTBOX_UI_SESSION_KEY": "short"}, "OUTBOX_UI_SESSION_KEY"),
        ({"OUTBOX_UI_TRACE_URL": "https://tempo.example/trace/"}, "OUTBOX_UI_TRACE_URL"),
        ({"OUTBOX_UI_BASE_PATH": "outbox/"}, "OUTBOX_UI_BASE_PATH"),
    ],
)
def test_bad_console_settings_are_one_line_naming_the_variable(
    db: str, settings: dict[str, str], variable: str
) -> None:
    result = run_outbox("ui", OUTBOX_DATABASE_URL=db, **settings)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert variable in result.stderr
    assert "short" not in result.stderr, "a secret's value is never echoed"


def test_the_command_serves_the_api_with_its_tokens(db: str, tmp_path: Path) -> None:
    port = free_port()
    env = outbox_env(
        OUTBOX_DATABASE_URL=db,
        OUTBOX_UI_HOST="127.0.0.1",
        OUTBOX_UI_PORT=str(port),
        OUTBOX_UI_TOKENS_FILE=str(tokens_file(tmp_path / "tokens")),
        OUTBOX_LOG_FORMAT="json",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "outbox.service.cli", "ui"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import urllib.error
        import urllib.request

        def answer(path: str, token: str | None = None) -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=_auth(token))
            try:
                with urllib.request.urlopen(request, timeout=2) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return exc.code
            except OSError:
                return 0

        wait_until("the console to listen", lambda: answer("/healthz") == 200)
        assert answer("/api/v1/relays") == 401
        assert answer("/api/v1/relays", VIEWER) == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert VIEWER not in out, "no token in the log"
    assert "console listening on http://127.0.0.1" in out


async def test_messages_page_by_id_and_only_an_operator_sees_a_payload_once_audited(
    console: Client, pg_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    msgs = [
        new_message("mail.login_link", {"code": f"91827{n}"}, T0, headers={"x-tenant": "acme"})
        for n in range(3)
    ]
    async with pg_store.begin() as tx:
        await pg_store.add(tx, *msgs)

    status, first = await console.get("/api/v1/messages?topic=mail.login_link&limit=2", VIEWER)
    assert status == 200
    assert [m["id"] for m in first["messages"]] == [str(m.id) for m in msgs[:2]]
    assert first["messages"][0]["state"] == "pending"
    assert first["messages"][0]["headers"] == {"x-tenant": None}, "a viewer sees header names"
    status, rest = await console.get(f"/api/v1/messages?after={first['next']}", VIEWER)
    assert [m["id"] for m in rest["messages"]] == [str(msgs[2].id)]
    assert rest["next"] is None
    assert "91827" not in json.dumps([first, rest]), "no payload in a listing"
    assert (await console.get("/api/v1/messages?state=sleeping", VIEWER))[0] == 400

    one = f"/api/v1/messages/{msgs[0].id}"
    status, shown = await console.get(one, VIEWER)
    assert (status, "payload" in shown) == (200, False)
    assert (await console.get(one + "?payload=1", VIEWER))[0] == 403
    with caplog.at_level(logging.INFO, logger="outbox.ui.audit"):
        status, revealed = await console.get(one + "?payload=1", OPERATOR)
    assert (status, json.loads(revealed["payload"])) == (200, {"code": "918270"})
    assert revealed["headers"] == {"x-tenant": "acme"}
    [line] = [r.getMessage() for r in caplog.records if r.name == "outbox.ui.audit"]
    assert line == f"olu (operator) reveal: topic=mail.login_link message={msgs[0].id}"
    assert (await console.get(f"/api/v1/messages/{uuid.uuid4()}", VIEWER))[0] == 404


async def test_a_topic_is_paused_here_unless_an_outboxtopic_governs_it(
    console: Client, pg_store: PostgresStore
) -> None:
    from outbox.store import TopicSettings

    assert (await console.post("/api/v1/topics/mail.welcome/pause", {}, VIEWER))[0] == 403
    status, paused = await console.post("/api/v1/topics/mail.welcome/pause", {}, OPERATOR)
    assert (status, paused) == (200, {"topic": "mail.welcome", "paused": True, "override": False})
    [welcome] = [
        t for t in (await console.get("/api/v1/topics", VIEWER))[1] if t["topic"] == "mail.welcome"
    ]
    assert welcome["paused"] is True

    await pg_store.set_topic(TopicSettings("hook.order", source="kubernetes:shop/orders"))
    status, refused = await console.post("/api/v1/topics/hook.order/pause", {}, OPERATOR)
    assert status == 409
    assert "kubectl -n shop patch outboxtopic orders --type merge" in refused["error"]
    assert (await pg_store.topics())["hook.order"].enabled is True
    status, forced = await console.post("/api/v1/topics/hook.order/pause?force=1", {}, OPERATOR)
    assert (status, forced["override"]) == (200, True)
    entry = (await pg_store.topics())["hook.order"]
    assert (entry.enabled, entry.source) == (False, "cli")
    status, _ = await console.post("/api/v1/topics/mail.welcome/resume", {}, OPERATOR)
    assert status == 200
    assert (await pg_store.topics())["mail.welcome"].enabled is True


async def test_a_bulk_requeue_of_keys_buried_messages_is_delivered_by_a_relay_in_key_order(
    db: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    """From the operator's requeue through the API to a real `outbox relay`:
    every key's requeued messages start in their order."""
    record = tmp_path / "starts"
    msgs = [
        new_message(recording.KEYED, {"n": n}, T0, key=f"order-{k}")
        for n in range(5)
        for k in range(3)
    ]
    async with connect_pool(db, max_size=2) as pool:
        store = PostgresStore(pool)
        async with store.begin() as tx:
            await store.add(tx, *msgs)
        for m in msgs:  # a receiver outage buried them all
            await store.bury(m.id, "receiver down: connection refused", at=T0)
        app = Console(store, TokenFile(tokens_file(tmp_path / "tokens"))).app()
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as s:
            console = Client(s, str(server.make_url("")).rstrip("/"))
            body = {"filter": {"topic": recording.KEYED, "error_contains": "CONNECTION REFUSED"}}
            status, done = await console.post("/api/v1/buried/requeue", body, OPERATOR)
    assert (status, done) == (200, {"count": 15})

    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=db,
        OUTBOX_HANDLERS="tests.integration.recording:keyed_handlers",
        OUTBOX_INTERVAL="100ms",
        RECORDING_FILE=str(record),
    )
    relays.append(relay)
    wait_until(
        "every message delivered", lambda: count(db, "SELECT count(*) FROM outbox_messages") == 0
    )
    starts = [line.split() for line in record.read_text().splitlines()]
    for k in range(3):
        ns = [int(n) for key, n, *_ in starts if key == f"order-{k}"]
        firsts = list(dict.fromkeys(ns))  # a retried start repeats its n
        assert firsts == [0, 1, 2, 3, 4], f"order-{k}: {ns}"


async def test_a_listing_that_reads_too_long_asks_for_a_narrower_filter(
    console: Client, pg_store: PostgresStore
) -> None:
    async with pg_store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox_messages (id, topic, payload, created_at, due_at)"
            " SELECT gen_random_uuid(), 'bulk.topic', '{}', now(), now()"
            " FROM generate_series(1, 200000)"
        )
    pg_store.operator.list_wait = 0.001  # what 2 s is to a table a thousand times larger

    status, answer = await console.get("/api/v1/messages?state=parked&key=nobody", VIEWER)

    assert status == 422
    assert "narrow the filter" in answer["error"]
    pg_store.operator.list_wait = 2.0
    status, _ = await console.get("/api/v1/messages?topic=bulk.topic&limit=5", VIEWER)
    assert status == 200


async def test_due_later_counts_are_believed_only_from_the_measurement_they_came_with(
    pg_store: PostgresStore,
) -> None:
    tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    async with pg_store.begin() as tx:
        await pg_store.add(tx, new_message("mail.a", {}, deliver_at=tomorrow))
    await pg_store.topic_stats(max_age=dt.timedelta(0))  # a relay of this release measures
    measured = await pg_store.backlog_measurement()
    assert measured is not None
    assert [s.due_later for s in measured[1]] == [1]
    # A relay of the release before rewrites the measurement without them.
    async with pg_store.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox_backlog (id, measured_at, stats) VALUES (true, now(), '[]') "
            "ON CONFLICT (id) DO UPDATE SET measured_at = clock_timestamp(), "
            "stats = '[[\"mail.a\", 1, 0, null, 0, null]]'"
        )
    measured = await pg_store.backlog_measurement()
    assert measured is not None
    assert [(s.pending, s.due_later) for s in measured[1]] == [(1, None)]


async def test_a_pending_listing_pages_on_by_its_cursor(
    console: Client, pg_store: PostgresStore
) -> None:
    msgs = [new_message("mail.a", {"n": n}, T0 + dt.timedelta(seconds=n)) for n in range(5)]
    async with pg_store.begin() as tx:
        await pg_store.add(tx, *msgs)
    seen: list[str] = []
    path = "/api/v1/messages?state=pending&limit=2"
    while True:
        status, page = await console.get(path, VIEWER)
        assert status == 200, page
        seen += [m["id"] for m in page["messages"]]
        if page["next"] is None:
            break
        path = f"/api/v1/messages?state=pending&limit=2&after={page['next']}"
    assert seen == [str(m.id) for m in msgs]
    assert (await console.get("/api/v1/messages?after=x~y", VIEWER))[0] == 400


async def test_every_role_for_every_action(console: Client, pg_store: PostgresStore) -> None:
    """401 without credentials; a viewer reads but gets 403 for a payload and
    for every change; an operator does each."""
    m = new_message("mail.welcome", {"code": "918273"}, T0)
    await bury(pg_store, m, reason="550")
    reads = [
        "/api/v1/topics",
        "/api/v1/relays",
        "/api/v1/keys/blocked",
        "/api/v1/messages",
        f"/api/v1/messages/{m.id}",
    ]
    dry = {"filter": {"topic": "mail.welcome"}, "dry_run": True}
    changes: list[tuple[str, Any]] = [
        ("/api/v1/buried/requeue", dry),
        ("/api/v1/buried/purge", dry),
        ("/api/v1/topics/mail.welcome/pause", {}),
        ("/api/v1/topics/mail.welcome/resume", {}),
    ]
    for path in reads:
        assert (await console.get(path))[0] == 401, path
        assert (await console.get(path, VIEWER))[0] == 200, path
        assert (await console.get(path, OPERATOR))[0] == 200, path
    reveal = f"/api/v1/messages/{m.id}?payload=1"
    assert [(await console.get(reveal, t))[0] for t in (None, VIEWER, OPERATOR)] == [401, 403, 200]
    for path, body in changes:
        assert (await console.post(path, body))[0] == 401, path
        status, answer = await console.post(path, body, VIEWER)
        assert status == 403, path
        assert "918273" not in json.dumps(answer)
        assert (await console.post(path, body, OPERATOR))[0] == 200, path
