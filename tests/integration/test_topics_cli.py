"""`outbox topics` round trip as a subprocess against a real PostgreSQL."""

from __future__ import annotations

import json

import anyio
import pytest

from outbox.postgres import migrate
from tests.integration.process import add_messages, run_outbox


@pytest.fixture
def db(pg_conninfo: str) -> str:
    anyio.run(migrate, pg_conninfo)
    return pg_conninfo


def topics(db: str, *args: str) -> tuple[int, str, str]:
    result = run_outbox("topics", *args, OUTBOX_DATABASE_URL=db)
    return result.returncode, result.stdout, result.stderr


def listed(db: str) -> dict[str, dict[str, object]]:
    code, out, err = topics(db, "list", "--output", "json")
    assert code == 0, err
    return {t["topic"]: t for t in json.loads(out)}


def test_set_pause_resume_delete_round_trip(db: str) -> None:
    add_messages(db, "orders.placed", 2)

    assert (
        topics(
            db, "set", "orders.placed", "--handler", "log", "--max-attempts", "3", "--timeout", "5s"
        )[0]
        == 0
    )
    entry = listed(db)["orders.placed"]
    assert (entry["handler"], entry["max_attempts"], entry["timeout"]) == ("log", 3, "5s")
    assert (entry["enabled"], entry["source"], entry["pending"]) == (True, "cli", 2)

    assert topics(db, "pause", "orders.placed") == (0, "orders.placed: paused, handler log\n", "")
    assert listed(db)["orders.placed"]["enabled"] is False
    assert listed(db)["orders.placed"]["max_attempts"] == 3  # pausing keeps the rest

    assert topics(db, "resume", "orders.placed")[0] == 0
    assert topics(db, "set", "orders.placed", "--max-attempts", "default")[0] == 0
    entry = listed(db)["orders.placed"]
    assert (entry["enabled"], entry["max_attempts"], entry["handler"]) == (True, None, "log")

    code, out, _ = topics(db, "list")
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["TOPIC", "ENABLED", "HANDLER"]

    assert topics(db, "delete", "orders.placed") == (0, "orders.placed: entry deleted\n", "")
    assert listed(db)["orders.placed"]["registered"] is False


def test_an_entry_an_outboxtopic_governs_is_refused_unless_forced(db: str) -> None:
    async def govern() -> None:
        from outbox.postgres import PostgresStore, connect_pool
        from outbox.store import TopicSettings

        async with connect_pool(db, max_size=1) as pool:
            entry = TopicSettings("orders.placed", handler="log", source="kubernetes:shop/orders")
            await PostgresStore(pool).govern_topic(entry)

    anyio.run(govern)

    for args in (("pause", "orders.placed"), ("delete", "orders.placed")):
        code, _out, err = topics(db, *args)
        assert code == 2
        then = {
            "pause": "this change is written as an operator's override, which holds until "
            "`outbox topics delete` hands the topic back to the resource",
            "delete": "the entry is removed, and the controller writes the resource's again "
            "at its next reconcile",
        }[args[0]]
        assert err.strip().splitlines() == [
            f"outbox topics {args[0]}: --force: orders.placed is governed by OutboxTopic "
            "shop/orders: change it with `kubectl -n shop edit outboxtopic orders` (with --force "
            f"{then})"
        ]
    assert listed(db)["orders.placed"]["enabled"] is True

    assert topics(db, "pause", "orders.placed", "--force")[0] == 0
    assert listed(db)["orders.placed"]["enabled"] is False
