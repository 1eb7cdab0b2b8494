"""`outbox buried` as an operator runs it, against a real PostgreSQL: in this process,
and as the real console script where it matters (what it prints and exits with)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry

from outbox import Message, Relay, RelayConfig, new_message
from outbox.postgres import PostgresStore, connect_pool, migrate
from tests.integration.process import query, run_outbox, run_outbox_here, run_outbox_within
from tests.tools import require_library

NOW = dt.datetime.now(dt.UTC)
CODE = "918273"


class Buried:
    """Buried messages in a fresh schema: two topics, buried at different times."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.old = new_message("mail.login_link", {"to": "a@example.com", "code": CODE}, NOW)
        self.recent = new_message("mail.login_link", {"to": "b@example.com", "code": "1"}, NOW)
        self.other = new_message("webhook.order", {"id": 7}, NOW)
        self.live = new_message("mail.login_link", {"to": "c@example.com"}, NOW)

        async def setup() -> None:
            await migrate(conninfo)
            async with connect_pool(conninfo, max_size=1) as pool:
                store = PostgresStore(pool)
                async with store.begin() as tx:
                    await store.add(tx, self.old, self.recent, self.other, self.live)
                await store.claim(NOW, dt.timedelta(seconds=1), 3)
                long_error = "smtp: 550 5.1.1 mailbox unavailable " + "x" * 200
                await store.bury(self.old.id, long_error, at=NOW - dt.timedelta(days=10))
                await store.bury(self.recent.id, "permanent: 550", at=NOW - dt.timedelta(minutes=5))
                await store.bury(self.other.id, "no handler", at=NOW - dt.timedelta(hours=2))
                await store.release([self.live], NOW)

        anyio.run(setup)

    def run(self, *args: str, real: bool = False) -> tuple[int, str, str]:
        """``outbox buried ARGS`` in this process, or with ``real`` as a process of its own."""
        run = run_outbox if real else run_outbox_here
        result = run("buried", *args, OUTBOX_DATABASE_URL=self.conninfo)
        return result.returncode, result.stdout, result.stderr

    def state(self, m: Message) -> dict[str, object]:
        code, out, err = self.run("show", str(m.id), "--output", "json")
        assert code == 0, err
        state: dict[str, object] = json.loads(out)
        return state

    def count(self) -> int:
        async def count() -> int:
            async with (
                connect_pool(self.conninfo, max_size=1) as pool,
                pool.connection() as conn,
            ):
                cur = await conn.execute("SELECT count(*) FROM outbox_messages")
                return int((await cur.fetchone() or (0,))[0])

        return anyio.run(count)


@pytest.fixture
def buried(pg_conninfo: str) -> Buried:
    return Buried(pg_conninfo)


def test_list_is_newest_first_aligned_and_shortens_errors(buried: Buried) -> None:
    code, out, _ = buried.run("list", real=True)

    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "TOPIC", "ATTEMPTS", "BURIED", "CREATED", "LAST", "ERROR"]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids == [str(buried.recent.id), str(buried.other.id), str(buried.old.id)]
    assert (
        len(
            {
                line.index(" mail.") if " mail." in line else line.index(" webhook")
                for line in lines[1:]
            }
        )
        == 1
    )
    assert "…" in lines[3]
    assert CODE not in out


def test_list_filters_and_json(buried: Buried) -> None:
    code, out, _ = buried.run(
        "list", "--topic", "mail.login_link", "--since", "1h", "--output", "json"
    )

    assert code == 0
    [entry] = json.loads(out)
    assert entry["id"] == str(buried.recent.id)
    assert entry["last_error"] == "permanent: 550"
    assert "payload" not in entry
    _, limited, _ = buried.run("list", "--limit", "1", "--output", "json")
    assert [e["id"] for e in json.loads(limited)] == [str(buried.recent.id)]


def test_show_hides_the_payload_unless_asked(buried: Buried) -> None:
    code, out, _ = buried.run("show", str(buried.old.id))
    assert code == 0
    assert "smtp: 550 5.1.1 mailbox unavailable " + "x" * 200 in out
    assert CODE not in out
    assert "--payload shows it" in out

    code, out, _ = buried.run("show", str(buried.old.id), "--payload", real=True)
    assert code == 0
    assert f'"code": "{CODE}"' in out


def test_requeue_by_id_is_delivered_by_the_next_poll(buried: Buried) -> None:
    code, dry, _ = buried.run("requeue", str(buried.old.id), "--dry-run")
    assert (code, dry) == (0, "would requeue 1 messages\n")
    assert buried.state(buried.old)["buried_at"] is not None

    code, out, err = buried.run("requeue", str(buried.old.id), str(buried.live.id))
    assert code == 0
    assert out == "requeued 1 messages\n"
    assert f"{buried.live.id}: not buried, left alone" in err
    state = buried.state(buried.old)
    assert state["buried_at"] is None
    assert state["attempts"] == 0
    assert str(state["last_error"]).startswith("smtp: 550")
    assert state["requeues"] == 1

    code, again, _ = buried.run("requeue", str(buried.old.id))
    assert (code, again) == (0, "requeued 0 messages\n")

    delivered: list[uuid.UUID] = []

    async def deliver() -> None:
        async def handle(m: Message) -> None:
            delivered.append(m.id)

        async with connect_pool(buried.conninfo, max_size=2) as pool:
            relay = Relay(
                PostgresStore(pool),
                {"mail.login_link": handle},
                RelayConfig.model_validate({"batch": 100}),
                registry=CollectorRegistry(),
            )
            await relay.poll()

    anyio.run(deliver)
    assert sorted(delivered) == sorted([buried.old.id, buried.live.id])


def test_requeue_by_topic_and_all(buried: Buried) -> None:
    code, out, _ = buried.run("requeue", "--topic", "webhook.order")
    assert (code, out) == (0, "requeued 1 messages\n")

    code, _, err = buried.run("requeue", "--all")
    assert code == 2
    assert "add --yes" in err

    code, out, _ = buried.run("requeue", "--all", "--yes")
    assert (code, out) == (0, "requeued 2 messages\n")
    _, listed, _ = buried.run("list", "--output", "json")
    assert json.loads(listed) == []


def test_purge_deletes_by_age(buried: Buried) -> None:
    code, dry, _ = buried.run("purge", "--older-than", "1d", "--dry-run")
    assert code == 0
    assert dry == "would delete 1 messages buried more than 24h ago\n"
    assert buried.count() == 4

    code, out, _ = buried.run("purge", "--older-than", "1h", "--topic", "webhook.order", "--yes")
    assert (code, out) == (0, "deleted 1 buried messages\n")
    code, out, _ = buried.run("purge", "--older-than", "7d", "--yes")
    assert (code, out) == (0, "deleted 1 buried messages\n")
    assert buried.count() == 2


def test_requeue_and_purge_what_an_error_text_and_an_age_select(buried: Buried) -> None:
    code, dry, _ = buried.run("requeue", "--error-contains", "550", "--dry-run")
    assert (code, dry) == (0, "would requeue 2 messages\n")
    code, out, _ = buried.run("requeue", "--error-contains", "550", "--older-than", "1h")
    assert (code, out) == (0, "requeued 1 messages\n")
    assert buried.state(buried.old)["buried_at"] is None
    assert buried.state(buried.recent)["buried_at"] is not None

    code, out, _ = buried.run("purge", "--error-contains", "NO handler", "--yes")
    assert (code, out) == (0, "deleted 1 buried messages\n")
    code, out, err = buried.run("purge", "--all", "--error-contains", "550")
    assert code == 2
    assert "--all (alone)" in err
    assert buried.count() == 3  # the requeued, the recent one, the live one


def test_commands_work_on_the_embedded_default_when_asked(tmp_path: Path) -> None:
    data = tmp_path / "data"

    listed = run_outbox_within(
        120, "buried", "list", "--embedded", "--output", "json", OUTBOX_DATA_DIR=str(data)
    )
    topics = run_outbox_within(
        120, "topics", "pause", "orders.placed", "--embedded", OUTBOX_DATA_DIR=str(data)
    )
    shown = run_outbox_within(120, "topics", "list", "--embedded", OUTBOX_DATA_DIR=str(data))

    assert (listed.returncode, json.loads(listed.stdout)) == (0, []), listed.stderr
    assert topics.returncode == 0, topics.stderr
    assert "orders.placed  paused" in shown.stdout
    assert not (data / "pgdata" / "postmaster.pid").exists(), "the embedded server was left running"


@pytest.mark.parametrize(
    "args",
    [("buried", "list"), ("buried", "requeue", "--all", "--yes"), ("topics", "list"), ("relays",)],
)
def test_operator_commands_without_a_database_url_refuse_to_guess(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = run_outbox(*args, OUTBOX_DATA_DIR=str(tmp_path / "data"))

    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"outbox {' '.join(args[:2] if args[0] != 'relays' else args[:1])}: OUTBOX_DATABASE_URL: "
        "unset; set it to the relays' database (or pass --embedded for the local embedded one "
        "under OUTBOX_DATA_DIR)"
    ]
    assert not (tmp_path / "data").exists(), "an empty database was started"


def test_operator_commands_go_by_the_databases_clock_not_their_own(buried: Buried) -> None:
    library = require_library("/usr/lib/*/faketime/libfaketime.so.1", "faketime")
    ahead = {"LD_PRELOAD": library, "FAKETIME": "+2d", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def run(*args: str) -> tuple[int, str]:
        result = run_outbox("buried", *args, OUTBOX_DATABASE_URL=buried.conninfo, **ahead)
        return result.returncode, result.stdout

    # Buried 10 days, 2 hours and 5 minutes ago: at +2d, 7d would wrongly reach none more.
    assert run("purge", "--older-than", "9d", "--dry-run") == (
        0,
        "would delete 1 messages buried more than 216h ago\n",
    )
    assert run("purge", "--older-than", "11d", "--dry-run")[1].startswith("would delete 0")
    listed = json.loads(run("list", "--since", "1h", "--output", "json")[1])
    assert [m["id"] for m in listed] == [str(buried.recent.id)]
    assert run("requeue", str(buried.recent.id)) == (0, "requeued 1 messages\n")
    [(due_in,)] = query(
        buried.conninfo,
        f"SELECT due_at - now() FROM outbox_messages WHERE id = '{buried.recent.id}'",
    )
    assert isinstance(due_in, dt.timedelta)
    assert abs(due_in) < dt.timedelta(seconds=30)


def test_list_reads_sizes_not_payloads(buried: Buried) -> None:
    code, out, _ = buried.run("list", "--output", "json")

    assert code == 0
    sizes = {m["id"]: m["bytes"] for m in json.loads(out)}
    assert sizes[str(buried.old.id)] == len(buried.old.payload)
    assert CODE not in out


def test_show_prints_a_payload_nested_too_deep_to_parse(buried: Buried) -> None:
    deep = "[" * 5000 + "]" * 5000
    query(
        buried.conninfo,
        f"UPDATE outbox_messages SET payload = '{deep}' WHERE id = '{buried.other.id}'",
    )

    result = run_outbox(
        "buried", "show", str(buried.other.id), "--payload", OUTBOX_DATABASE_URL=buried.conninfo
    )

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert deep in result.stdout
