"""The relay's requests on every store: a claim record, a settlement of outcome values.

Both stores give the same answers: the ids written per outcome, the fenced
ones only while their lease holds, an ack only of what it removed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from outbox import Message, NotFound, Store, new_message
from outbox.requests import (
    Acked,
    Buried,
    ClaimRequest,
    Orphans,
    Released,
    Retried,
    Settled,
)
from tests.clock import T0

LEASE = dt.timedelta(minutes=2)
SECOND = dt.timedelta(seconds=1)


async def add(store: Store[Any], *msgs: Message) -> None:
    async with store.begin() as tx:
        await store.add(tx, *msgs)


def msgs(n: int, key: str | None = None, topic: str = "mail.x") -> list[Message]:
    return [new_message(topic, {"n": i}, T0 - (n - i) * SECOND, key=key) for i in range(n)]


async def test_a_settlement_writes_each_kind_and_answers_per_outcome(store: Store[Any]) -> None:
    plain = msgs(4)
    keyed = msgs(1, key="k")
    await add(store, *plain, *keyed)
    a, r, b, rel, k = (await store.claim_many(ClaimRequest(limit=10, lease=LEASE, now=T0))).messages

    settled = await store.settle(
        [
            Acked(a),
            Acked(k),
            Retried(r, dt.timedelta(minutes=1), "503", counted=False),
            Buried(b, "550 no such mailbox"),
            Released(rel),
        ],
        now=T0,
    )

    assert settled == Settled(acked={a.id, k.id}, retried={r.id}, buried={b.id}, released={rel.id})
    for gone in (a, k):
        with pytest.raises(NotFound):
            await store.get(gone.id)
    retried, buried, released = [await store.get(m.id) for m in (r, b, rel)]
    assert retried.message.attempts == 0  # uncounted: the receiver failed
    assert retried.due_at == T0 + dt.timedelta(minutes=1)
    assert buried.last_error == "550 no such mailbox"
    assert released.leased_until is None
    [again] = await store.claim(T0, LEASE, 10)  # only the released one is due now
    assert again.id == rel.id


async def test_a_stale_lease_writes_nothing_and_an_ack_answers_what_it_removed(
    store: Store[Any],
) -> None:
    await add(store, *msgs(4), *msgs(1, key="k", topic="orders.x"))
    stale = (await store.claim_many(ClaimRequest(limit=10, lease=LEASE, now=T0))).messages
    current = await store.claim(T0 + LEASE, LEASE, 10)  # the leases ran out: claimed again
    assert {m.id for m in current} == {m.id for m in stale}
    keyed = next(m for m in stale if m.key is not None)
    unkeyed = [m for m in stale if m.key is None]
    await store.ack(unkeyed[0].id)  # an operator got there first

    settled = await store.settle(
        [
            Acked(unkeyed[0]),  # gone: not removed by this ack
            Acked(unkeyed[1]),  # unkeyed: removed whoever holds it
            Acked(keyed),  # keyed: fenced by its lease
            Retried(unkeyed[2], SECOND, "stale"),
            Buried(unkeyed[3], "stale"),
        ],
        now=T0 + LEASE,
    )

    assert settled == Settled(acked={unkeyed[1].id})
    assert (await store.get(keyed.id)).leased_until is not None  # the current holder's
    assert (await store.get(unkeyed[2].id)).last_error is None
    assert (await store.get(unkeyed[3].id)).buried_at is None
    fresh = {m.id: m for m in current}
    released = await store.settle([Released(fresh[keyed.id])], now=T0 + LEASE)
    assert released == Settled(released={keyed.id})


async def test_a_runs_acks_alone_are_settled_and_fenced(store: Store[Any]) -> None:
    await add(store, *msgs(3, key="hot"))
    request = ClaimRequest(limit=1, lease=LEASE, now=T0, run=16, room=3)
    run = (await store.claim_many(request)).messages
    assert [m.json()["n"] for m in run] == [0, 1, 2]
    wrong = dataclasses.replace(run[1], lease=None)

    assert await store.settle([Acked(run[0], run=True)]) == Settled(acked={run[0].id})
    assert await store.settle([Acked(wrong, run=True)]) == Settled()
    assert await store.settle([Acked(run[1], run=True), Acked(run[2])]) == Settled(
        acked={run[1].id, run[2].id}
    )


async def test_the_designs_claim_is_the_record_with_its_defaults(store: Store[Any]) -> None:
    await add(store, *msgs(3))
    first = await store.claim(T0, LEASE, 2)
    rest = await store.claim_many(ClaimRequest(limit=10, lease=LEASE, now=T0))
    assert [m.json()["n"] for m in first + rest.messages] == [0, 1, 2]
    assert rest.orphans == 0
    # Orphans are claimed in their place in line by default, left by LEAVE.
    later = T0 + LEASE
    assert (
        await store.claim_many(
            ClaimRequest(limit=10, lease=LEASE, now=later, orphans=Orphans.LEAVE)
        )
    ).orphans == 3
    assert len(await store.claim(later, LEASE, 10)) == 3


@pytest.mark.parametrize(("lease", "limit"), [(dt.timedelta(0), 1), (LEASE, 0)])
def test_a_request_that_can_only_be_a_mistake_is_refused(lease: dt.timedelta, limit: int) -> None:
    with pytest.raises(ValueError, match=r"lease must be positive|limit must be at least 1"):
        ClaimRequest(limit=limit, lease=lease)


async def test_a_claim_from_a_watermark_passes_what_is_due_before_it_but_not_recent_orphans(
    store: Store[Any],
) -> None:
    early, late = msgs(2)  # due a second apart
    await add(store, early)
    await store.claim(T0, LEASE, 1)  # its relay dies: an orphan once the lease ends
    await add(store, late)
    fresh = new_message("mail.x", {"n": 9}, T0 + SECOND)
    await add(store, fresh)
    now = T0 + LEASE + SECOND

    from_mark = await store.claim_many(
        ClaimRequest(limit=10, lease=LEASE, now=now, after=T0 + SECOND)
    )

    # The late one is due before the watermark: passed. The orphan, whose lease
    # ended after it, is found.
    assert {m.id for m in from_mark.messages} == {early.id, fresh.id}
    assert from_mark.last_due == T0 + SECOND  # the last ready one's, orphans aside
    [rest] = (await store.claim_many(ClaimRequest(limit=10, lease=LEASE, now=now))).messages
    assert rest.id == late.id  # a look from the start finds it


async def test_a_claim_from_a_watermark_passes_an_orphan_whose_lease_ended_before_it(
    store: Store[Any],
) -> None:
    [m] = msgs(1)
    await add(store, m)
    await store.claim(T0, LEASE, 1)  # its relay dies: an orphan at T0 + LEASE
    now = T0 + LEASE + 10 * SECOND

    from_mark = await store.claim_many(
        ClaimRequest(limit=10, lease=LEASE, now=now, after=T0 + LEASE + SECOND)
    )

    assert from_mark.messages == []
    [again] = (await store.claim_many(ClaimRequest(limit=10, lease=LEASE, now=now))).messages
    assert again.id == m.id  # a look from the start finds it
