"""Least privilege with real roles: an owner migrates, relays get DML, producers INSERT only."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox import new_message
from outbox.handlers import HandlerKinds
from outbox.postgres import PostgresStore, add_sync, connect_pool
from outbox.postgres.ring import set_period
from tests.integration import recording
from tests.integration.process import RelayProcess, count, run_outbox, wait_until


class Roles:
    """Login roles of one test (owner, relay, app, squatter) and a schema the owner owns."""

    def __init__(self, postgres_url: str) -> None:
        self.admin = postgres_url
        tag = uuid.uuid4().hex[:8]
        self.names = {
            k: f"t_{k}_{tag}"
            for k in ("owner", "relay", "app", "squatter", "operator", "controller", "console")
        }
        self.schema = f"t_roles_{tag}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for name in self.names.values():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            conn.execute(
                sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                    sql.Identifier(self.schema), sql.Identifier(self.names["owner"])
                )
            )

    def url(self, who: str) -> str:
        return make_conninfo(
            self.admin, user=self.names[who], options=f"-c search_path={self.schema}"
        )

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
            for name in self.names.values():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def roles(postgres_url: str) -> Iterator[Roles]:
    r = Roles(postgres_url)
    yield r
    r.drop()


def test_an_owner_migrates_relays_run_on_dml_and_producers_only_insert(
    roles: Roles, relays: list[RelayProcess], tmp_path: Path
) -> None:
    migrated = run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner"))
    assert migrated.returncode == 0, migrated.stderr
    grants = run_outbox(
        "migrate",
        "--grants",
        f"relay={roles.names['relay']}",
        f"producer={roles.names['app']}",
        "--schema",
        roles.schema,
    )
    assert grants.returncode == 0, grants.stderr
    with psycopg.connect(roles.url("owner"), autocommit=True) as owner:
        owner.execute(grants.stdout.encode())

    with psycopg.connect(roles.url("app"), autocommit=True) as app:
        with app.transaction():
            add_sync(app, *(new_message("orders.placed", {"n": n}) for n in range(5)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT payload FROM outbox_messages")
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=roles.url("relay"),
        OUTBOX_INTERVAL="100ms",
        OUTBOX_LOG_TOPICS="orders.placed",
    )
    relays.append(relay)
    relay.wait_ready()
    wait_until(
        "the relay to deliver",
        lambda: count(roles.url("owner"), "SELECT count(*) FROM outbox_messages") == 0,
    )
    assert count(roles.url("owner"), "SELECT count(*) FROM outbox_relays") == 1
    assert "Traceback" not in relay.log
    assert "permission denied" not in relay.log

    # Nothing to apply: a role without DDL rights may run migrate (every helm upgrade does).
    again = run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("relay"))
    assert again.returncode == 0, again.stderr
    with psycopg.connect(roles.url("relay")) as r, pytest.raises(psycopg.errors.Error):
        r.execute("DROP TABLE outbox_messages")


def test_each_role_does_its_own_job_under_the_printed_grants(
    roles: Roles, relays: list[RelayProcess], tmp_path: Path
) -> None:
    """migrate (owner), a relay, a producer, the operator's commands and the
    controller's reconcile and status, each under its own role: all work."""
    assert run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner")).returncode == 0
    n = roles.names
    grants = run_outbox(
        "migrate", "--grants", f"relay={n['relay']}", f"producer={n['app']}",
        f"controller={n['controller']}", f"operator={n['operator']}", "--schema", roles.schema,
    )  # fmt: skip
    with psycopg.connect(roles.url("owner"), autocommit=True) as owner:
        owner.execute(grants.stdout.encode())

    with psycopg.connect(roles.url("app"), autocommit=True) as app, app.transaction():
        add_sync(app, new_message(recording.FAILING, {"n": 1}))
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=roles.url("relay"),
        OUTBOX_HANDLERS="tests.integration.recording:failing_handlers",
        OUTBOX_MAX_ATTEMPTS="1",
        OUTBOX_INTERVAL="100ms",
    )
    relays.append(relay)
    relay.wait_ready()
    buried = "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL"
    wait_until("the burial", lambda: count(roles.url("owner"), buried) == 1)

    operator = {"OUTBOX_DATABASE_URL": roles.url("operator")}
    listed = run_outbox("buried", "list", **operator)
    assert listed.returncode == 0, listed.stderr
    assert recording.FAILING in listed.stdout
    assert run_outbox("relays", **operator).stdout.count(recording.FAILING) == 1
    requeued = run_outbox("buried", "requeue", "--topic", recording.FAILING, **operator)
    assert requeued.returncode == 0, requeued.stderr
    paused = run_outbox("topics", "pause", recording.FAILING, **operator)
    assert paused.returncode == 0, paused.stderr

    status = anyio.run(_controller, roles.url("controller"))
    assert status["conditions"][0]["type"] == "Ready", status
    assert status["relays"] == 1
    assert "permission denied" not in relay.log


async def _controller(url: str) -> dict[str, Any]:
    """The controller's reconcile of one OutboxTopic and its status refresh."""
    from outbox.controller.handlers import BUILTIN_TOPICS
    from outbox.controller.reconcile import backlog, reconcile

    now = dt.datetime.now(dt.UTC)
    async with connect_pool(url, max_size=1) as pool:
        store = PostgresStore(pool)
        spec = {"topic": "orders.placed", "handler": "log"}
        outcome = await reconcile(
            store, spec, source="kubernetes:shop/orders", generation=1, now=now,
            lease=dt.timedelta(minutes=2), builtin_topics=BUILTIN_TOPICS,
            kinds=HandlerKinds().mapping,
        )  # fmt: skip
        return {**outcome.status, **await backlog(store, recording.FAILING, now)}


def test_migrate_refuses_to_adopt_a_table_someone_else_created(roles: Roles) -> None:
    with psycopg.connect(roles.admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT CREATE, USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(roles.schema), sql.Identifier(roles.names["squatter"])
            )
        )
    with psycopg.connect(roles.url("squatter"), autocommit=True) as squatter:
        squatter.execute("CREATE TABLE outbox_backlog (id boolean PRIMARY KEY, stats jsonb)")

    result = run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner"))

    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "outbox migrate: migration 0001_outbox_messages: table outbox_backlog is owned by"
    )
    assert f"owned by {roles.names['squatter']}, not by the migrating role" in line
    applied = count(roles.url("owner"), "SELECT count(*) FROM outbox_schema_migrations")
    assert applied == 0, "nothing is recorded while a foreign outbox table is there"


def test_a_relay_without_the_grants_to_register_says_so_once_and_is_not_ready(
    roles: Roles, relays: list[RelayProcess], tmp_path: Path
) -> None:
    assert run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner")).returncode == 0
    with psycopg.connect(roles.url("owner"), autocommit=True) as owner:
        # DML on the messages only: no row of its own in outbox_relays.
        owner.execute(
            sql.SQL(
                "GRANT USAGE ON SCHEMA {s} TO {r};"
                " GRANT SELECT, UPDATE, DELETE ON outbox_messages TO {r};"
                " GRANT SELECT ON outbox_topics, outbox_schema_migrations TO {r}"
            ).format(s=sql.Identifier(roles.schema), r=sql.Identifier(roles.names["relay"]))
        )
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=roles.url("relay"),
        OUTBOX_INTERVAL="100ms",
        OUTBOX_LOG_TOPICS="orders.placed",
    )
    relays.append(relay)
    wait_until("the failure said", lambda: "housekeeping failed" in relay.log)
    statuses = []
    for _ in range(10):  # a second of housekeeping rounds, every 100 ms
        statuses.append(relay.status("/readyz"))
        time.sleep(0.1)

    assert 200 not in statuses
    said = [r for r in relay.log_records() if "housekeeping failed" in r["message"]]
    assert len(said) == 1, said
    assert "permission denied for table outbox_relays" in said[0]["message"]
    assert "Traceback" not in relay.log


def test_a_pinned_schema_holds_the_tables_whatever_the_connections_search_path(
    postgres_url: str, relays: list[RelayProcess], tmp_path: Path
) -> None:
    schema = f"t_pin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        [(before,)] = conn.execute("SELECT to_regclass('public.outbox_messages')").fetchall()
    pinned = {"OUTBOX_DATABASE_URL": postgres_url, "OUTBOX_DATABASE_SCHEMA": schema}
    try:
        missing = run_outbox("migrate", **{**pinned, "OUTBOX_DATABASE_SCHEMA": schema + "x"})
        migrated = run_outbox("migrate", **pinned)
        in_schema = make_conninfo(postgres_url, options=f"-c search_path={schema}")
        with psycopg.connect(in_schema, autocommit=True) as app, app.transaction():
            add_sync(app, new_message("orders.placed", {"n": 1}))
        relay = RelayProcess(
            tmp_path, OUTBOX_INTERVAL="100ms", OUTBOX_LOG_TOPICS="orders.placed", **pinned
        )
        relays.append(relay)
        relay.wait_ready()
        wait_until(
            "the delivery",
            lambda: count(in_schema, "SELECT count(*) FROM outbox_messages") == 0,
        )
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            [(after,)] = conn.execute("SELECT to_regclass('public.outbox_messages')").fetchall()
    finally:
        for r in relays:
            r.stop()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"outbox migrate: OUTBOX_DATABASE_SCHEMA: schema {schema}x does not exist (or this "
        f"role may not use it); create it first: CREATE SCHEMA {schema}x AUTHORIZATION "
        "<the role that runs migrate>"
    )
    assert migrated.returncode == 0, migrated.stderr
    assert after == before, "nothing was created outside the pinned schema"


def test_a_relay_that_may_not_truncate_says_so_once_and_delivers_on(
    roles: Roles, relays: list[RelayProcess], tmp_path: Path
) -> None:
    assert run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner")).returncode == 0
    n = roles.names
    grants = run_outbox("migrate", "--grants", f"relay={n['relay']}", f"producer={n['app']}",
                        "--schema", roles.schema)  # fmt: skip
    with psycopg.connect(roles.url("owner"), autocommit=True) as owner:
        owner.execute(grants.stdout.encode())
        owner.execute(  # a DBA who granted the relay what it had before the ring
            sql.SQL("REVOKE TRUNCATE ON outbox_messages_0, outbox_messages_1 FROM {}").format(
                sql.Identifier(n["relay"])
            )
        )
        set_period(owner, 1)  # a slot a second: the first one to empty comes soon
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=roles.url("relay"),
        OUTBOX_INTERVAL="100ms",
        OUTBOX_HANDLERS="tests.integration.recording:file_handlers",
        RECORDING_FILE=str(tmp_path / "starts"),
    )
    relays.append(relay)
    relay.wait_ready()

    said = "could not empty the outbox's storage"
    for _ in range(3):  # messages in both slots, delivered while neither can be emptied
        with psycopg.connect(roles.url("app"), autocommit=True) as app, app.transaction():
            add_sync(app, *(new_message(recording.TOPIC, {"n": i}) for i in range(20)))
        wait_until("delivery", lambda: count(roles.url("owner"), _LEFT) == 0)
        wait_until("the refusal said", lambda: said in relay.log)

    assert relay.status("/readyz") == 200, "delivery goes on: the relay stays ready"
    lines = [r["message"] for r in relay.log_records() if said in r["message"]]
    assert len(lines) == 1, lines
    assert "permission denied for table outbox_messages_" in lines[0]
    assert "Traceback" not in relay.log


_LEFT = "SELECT count(*) FROM outbox_messages"


async def test_a_read_only_console_reads_everything_and_refuses_changes_with_the_reason(
    roles: Roles, tmp_path: Path
) -> None:
    import aiohttp
    from aiohttp.test_utils import TestServer

    from outbox.service.ui import Console, TokenFile

    assert run_outbox("migrate", OUTBOX_DATABASE_URL=roles.url("owner")).returncode == 0
    grants = run_outbox(
        "migrate", "--grants", f"console={roles.names['console']}", "--schema", roles.schema
    )
    assert grants.returncode == 0, grants.stderr
    with psycopg.connect(roles.url("owner"), autocommit=True) as owner:
        owner.execute(grants.stdout.encode())
        with owner.transaction():
            add_sync(owner, new_message("orders.placed", {"n": 1}))
        owner.execute("UPDATE outbox_messages SET buried_at = now(), last_error = 'boom'")
    tokens = tmp_path / "tokens"
    tokens.write_text("olu operator operator-token-0123456789\n")
    auth = {"Authorization": "Bearer operator-token-0123456789"}

    async with connect_pool(roles.url("console"), max_size=2) as pool:
        app = Console(PostgresStore(pool), TokenFile(tokens)).app()
        async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as s:
            base = str(server.make_url("")).rstrip("/")
            async with s.get(f"{base}/api/v1/topics", headers=auth) as r:
                assert r.status == 200
                assert [t["buried"] for t in await r.json()] == [1]
            async with s.get(f"{base}/api/v1/messages?state=buried", headers=auth) as r:
                assert (r.status, len((await r.json())["messages"])) == (200, 1)
            body = {"filter": {"all": True}}
            async with s.post(f"{base}/api/v1/buried/requeue", json=body, headers=auth) as r:
                refused = await r.json()
                assert r.status == 403
            assert "--grants operator=ROLE" in refused["error"]
            assert "permission denied" in refused["error"]
            # The pages, to an operator of this console: the change buttons are gone.
            async with s.get(f"{base}/buried", headers=auth) as r:
                page = await r.text()
                assert r.status == 200
                assert "boom" in page
                assert "all that match" not in page
                assert 'type="checkbox"' not in page
    assert (
        count(
            roles.url("owner"), "SELECT count(*) FROM outbox_messages WHERE buried_at IS NOT NULL"
        )
        == 1
    )
