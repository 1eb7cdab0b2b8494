"""Conflicts the server rolls a statement back for, against real PostgreSQL: a
claim or an ack is sent again, and what a claim took is never left in no
relay's hands by a statement after it that failed."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from outbox import OutboxError, new_message
from outbox.postgres import PostgresStore
from outbox.postgres.statements import RERUNS
from outbox.requests import ClaimRequest
from tests.clock import T0

LEASE = dt.timedelta(minutes=2)

_CONFLICTED = """
CREATE SEQUENCE tries;
CREATE FUNCTION conflicted(code text, times int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint := nextval('tries');
BEGIN
    IF n <= times THEN
        RAISE EXCEPTION 'conflict %', n USING ERRCODE = code;
    END IF;
    RETURN n;
END $$;
"""


def _tries(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT last_value FROM tries").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize(
    "code", ["40001", "40P01", "40000"], ids=["serialization", "deadlock", "rollback"]
)
async def test_a_statement_rolled_back_for_a_conflict_is_sent_again(
    pg_store: PostgresStore, pg_conninfo: str, code: str
) -> None:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(_CONFLICTED)
    query = "SELECT conflicted(%(code)s, %(times)s)"

    rows = await pg_store.statements.fetch(query, {"code": code, "times": RERUNS - 1})
    assert rows == [(RERUNS,)], "the last run answered"

    with pytest.raises(OutboxError, match="conflict"):
        await pg_store.statements.count(query, {"code": code, "times": 2 * RERUNS})
    assert _tries(pg_conninfo) == 2 * RERUNS, "sent RERUNS times, then the conflict is raised"


async def test_a_statement_whose_completion_is_unknown_is_not_sent_again(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(_CONFLICTED)
    with pytest.raises(OutboxError, match="conflict 1"):
        await pg_store.statements.fetch(
            "SELECT conflicted(%(code)s, 5)", {"code": "40003", "times": 5}
        )
    assert _tries(pg_conninfo) == 1


async def test_a_claim_whose_key_runs_fail_keeps_and_returns_the_heads_it_took(
    pg_store: PostgresStore, pg_conninfo: str
) -> None:
    """The claim commits its heads before the runs behind them are claimed; the
    runs' statement failing must not lose the heads (they would wait out their
    lease in no relay's hands)."""
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(
            """
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused'; END $$;
            CREATE TRIGGER refuse BEFORE UPDATE ON outbox_messages FOR EACH ROW
            WHEN (NEW.lease_token IS NOT NULL AND NEW.payload::jsonb ? 'refused')
            EXECUTE FUNCTION refuse();
            """
        )
    head = new_message("orders.events", {"n": 0}, T0, key="order-1")
    follower = new_message("orders.events", {"n": 1, "refused": True}, T0, key="order-1")
    async with pg_store.begin() as tx:
        await pg_store.add(tx, head, follower)

    claimed = await pg_store.claim_many(ClaimRequest(now=T0, lease=LEASE, limit=10, run=10))

    assert [m.id for m in claimed.messages] == [head.id], "the head, without its run"
    [taken] = claimed.messages
    assert taken.lease is not None
    assert await pg_store.ack_many([taken.id], tokens=[taken.lease]) == {head.id}, (
        "its lease is the one the claim wrote"
    )
