"""The ring of partitions outbox_messages is made of (migration 0018;
docs/design/held-snapshots.md): which slots a claim reads, and the rotation
that empties the slot that is not current.

An insert's slot is the ring's current one by the database's clock: slot
``floor(epoch / seconds) % slots``. Claims read the current slot, the one
before it for a grace after the turn (its last messages), and the long-stay
partition (slot -1) while it holds something due; every ``EVERY`` seconds,
all of them. Each read is limited to its slots by a constant the planner
prunes the other partitions with: a claim plans one partition, not three.

The rotation empties a slot once it is no longer current: it moves, once,
whatever waits there (due later, buried, parked, an orphan) to the long-stay
partition, then TRUNCATEs the slot if nothing is left, under a lock it takes
waiting for it at most 50 ms (claims hold it for instants); no producer
inserts into a slot that is
not current, so none ever waits for it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import time
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql as pgsql

from outbox.postgres.queries import QUERIES
from outbox.postgres.statements import Statements

__all__ = ["EVERY", "MOVE_BATCH", "STAY", "Ring", "Rotation", "SlotPicker", "set_period"]

log = logging.getLogger("outbox.postgres")

STAY = -1
"""The long-stay partition: the table as it was before the ring."""
EVERY = 10.0
"""At least this often (seconds) a claim reads every slot, to find what the
rotation has not moved yet (when no relay rotates: say, none may TRUNCATE)."""
REFRESH = 1.0
"""How often (seconds) a store reads the ring's state: the database's clock and
when the long-stay partition next holds something due."""
MOVE_BATCH = 1000
"""Messages moved to the long-stay partition in one statement (and commit)."""
MOVES = 20
"""Most batches one rotation pass moves; the next pass goes on."""
REFUSALS = 5
"""Refusals of a slot's lock in a row after which the rotation leaves the slot
alone for a pass, twice as many after each next refusal..."""
REFUSED_SKIP = 16
"""...up to this many passes (a slot emptied starts again)."""

_STATE = QUERIES["ring_state"]
_MOVE = QUERIES["ring_move"]
_EMPTY = QUERIES["ring_empty"]
_UNSYNCED = "SET LOCAL synchronous_commit = off"
# Claims that read every partition (a key's head check) hold the slot's lock
# for milliseconds, back to back on a busy fleet: NOWAIT was refused pass after
# pass. No producer inserts into a slot that is not current, so what waits
# behind this (at most this long) is a claim, never a producer.
_LOCK_WAIT = "SET LOCAL lock_timeout = '50ms'"


@dataclasses.dataclass(frozen=True, slots=True)
class Ring:
    """``slots`` ring partitions of ``seconds`` each (outbox_ring)."""

    slots: int = 2
    seconds: int = 10

    @property
    def grace(self) -> float:
        """After a turn, how long claims still read the slot before (its last
        messages: transactions that committed just after it), and how long
        before its next turn the rotation leaves a slot alone. Held, a slot
        keeps everything it took until it is emptied, a grace after its turn:
        the shorter, the smaller the ring (a transaction that commits later
        is found by the next claim of every slot, and its slot is not emptied
        under it: the lock waits for it)."""
        return self.seconds / 10

    @property
    def pace(self) -> float:
        """How often (seconds) the rotation looks at the slots: at least twice
        in each grace, and at most once a REFRESH."""
        return min(REFRESH, self.grace / 2)

    @property
    def every(self) -> list[int]:
        """Every slot, the long-stay partition first."""
        return [STAY, *range(self.slots)]

    def current(self, epoch: float) -> int:
        """The slot an insert at ``epoch`` (the database's clock) goes to."""
        return math.floor(epoch / self.seconds) % self.slots

    def live(self, epoch: float) -> list[int]:
        """The ring slots that may hold due messages at ``epoch``: the current
        one, and the one before it within the grace after the turn."""
        now = self.current(epoch)
        if epoch % self.seconds < self.grace and self.slots > 1:
            return sorted({now, (now - 1) % self.slots})
        return [now]

    def emptiable(self, epoch: float) -> list[int]:
        """The slots the rotation may empty at ``epoch``: no longer current for
        the grace, and not current again for the grace."""
        now, into = self.current(epoch), epoch % self.seconds
        out = []
        for slot in range(self.slots):
            if slot == now:
                continue
            since = ((now - slot) % self.slots - 1) * self.seconds + into
            until = ((slot - now) % self.slots) * self.seconds - into
            if since >= self.grace and until >= self.grace:
                out.append(slot)
        return out


class SlotPicker:
    """Which slots a store's claims read, from the ring's state read at most every
    REFRESH seconds (one statement; time here paces the reads, it decides nothing
    a test drives: a claim with an injected clock reads every slot)."""

    def __init__(self) -> None:
        self.ring: Ring | None = None
        self._offset = 0.0  # the database's clock less this process's
        self._stay_next: float | None = None
        self._read_at = -math.inf
        self._every_at = 0.0
        self._unread: str | None = None
        self._draining: dict[int, float] = {}
        self._found: set[int] = set()

    def stale(self) -> bool:
        """Whether the ring's state is due to be read again."""
        return time.monotonic() >= self._read_at + REFRESH

    def unread(self, why: str) -> None:
        """The ring's state could not be read: claims read every slot, until a
        read works (tried again in a minute). Said once a cause."""
        if why != self._unread:
            log.warning(
                "cannot read the outbox's ring (%s): claims read every partition, "
                "which costs each claim more; grant SELECT on outbox_ring "
                "(`outbox migrate --grants relay=ROLE` prints it)",
                why,
            )
        self._unread = why
        self._read_at = time.monotonic() + 60 - REFRESH

    def update(self, row: Any) -> None:
        """Take a row of ring_state."""
        slots, seconds, epoch, stay_next = row
        self.ring = Ring(slots, seconds)
        self._offset = epoch - time.time()
        self._stay_next = stay_next
        self._read_at = time.monotonic()
        if self._unread is not None:
            log.info("the outbox's ring is read again")
            self._unread = None

    def pick(self) -> tuple[list[int], dt.datetime | None]:
        """The slots the next claim reads and, when that includes the long-stay
        partition, the due time it should read it from (a watermark must not
        pass over what the rotation moved there with its old due time)."""
        ring = self.ring or Ring()
        epoch = time.time() + self._offset
        if self._unread is not None or time.monotonic() >= self._every_at:
            self._every_at = time.monotonic() + EVERY
            return ring.every, None
        slots = ring.live(epoch)
        if self._found:
            slots = sorted({*slots, *self._found})
        if self._draining:
            now = time.monotonic()
            self._draining = {slot: until for slot, until in self._draining.items() if until > now}
            slots = sorted({*slots, *self._draining})
        if self._stay_next is not None and self._stay_next <= epoch:
            if self._stay_next == -math.inf:  # moved just now: due whenever
                return [STAY, *slots], dt.datetime.min.replace(tzinfo=dt.UTC)
            return [STAY, *slots], dt.datetime.fromtimestamp(self._stay_next, dt.UTC)
        return slots, None

    @property
    def claiming(self) -> set[int]:
        """The ring slots the last claim took messages from."""
        return self._found

    def found(self, slots: set[int | None]) -> None:
        """The last claim took messages from ``slots``: a ring slot among them is
        read by the next claim too, live or not (a backlog still due there
        when its grace ended), until a claim takes none from it."""
        self._found = {s for s in slots if s is not None and s != STAY}

    def draining(self, slot: int) -> None:
        """The rotation found more waiting in ``slot`` than one pass moves (a
        backlog): claims read it too meanwhile, as they read what was moved."""
        self._draining[slot] = time.monotonic() + 2 * REFRESH

    def moved(self) -> None:
        """This store just moved messages to the long-stay partition: read it."""
        self._stay_next = -math.inf
        self._read_at = -math.inf


class Rotation:
    """Empties the ring's slots that are no longer current (one pass: ``once``)."""

    def __init__(self, statements: Statements, picker: SlotPicker) -> None:
        self.statements = statements
        self.picker = picker
        # A slot whose lock was refused pass after pass (a pg_dump holds it for
        # minutes, and each pass would read every dead row it keeps) is left
        # alone for some passes: slot -> (refusals in a row, passes left).
        self._refused: dict[int, tuple[int, int]] = {}
        self._next = -math.inf

    async def once(self, now: dt.datetime | None = None) -> int:
        """Move what waits in each slot the ring may empty now, then TRUNCATE the
        slot if it is empty and holds anything; return the messages moved.
        ``now`` (tests) is the clock that decides which leases ended and which
        slot is current. Without it, a pass sooner than the ring's pace after
        the last (a relay's short interval) does nothing."""
        if now is None:
            if time.monotonic() < self._next:
                return 0
            self._next = time.monotonic() + (self.picker.ring or Ring()).pace
        [row] = await self.statements.fetch(_STATE, {})
        self.picker.update(row)
        ring = self.picker.ring or Ring()
        epoch = row[2] if now is None else now.timestamp()
        lap = dt.timedelta(seconds=ring.slots * ring.seconds)
        params = {"limit": MOVE_BATCH, "now": now}
        moved = 0
        for slot in ring.emptiable(epoch):
            # Whatever no lease holds moves, unless this relay's claims are
            # taking messages from the slot (a backlog being drained there):
            # then only what they will not take before its next turn moves.
            draining = slot in self.picker.claiming
            later = lap if draining else dt.timedelta(0)
            waited = None if draining else dt.timedelta(0)
            refusals, left = self._refused.get(slot, (0, 0))
            if left > 0:
                self._refused[slot] = (refusals, left - 1)
                continue
            [(_, size)] = await self.statements.fetch(_EMPTY, _emptying(slot))
            if not size:  # emptied already: nothing enters a slot that is not current
                continue
            last = None
            for _ in range(MOVES):
                ids = await self.statements.fetch(
                    _MOVE,
                    {**params, "slot": slot, "from": last, "later": later, "waited": waited},
                )
                moved += len(ids)
                if ids:
                    last = max(r[0] for r in ids)
                if len(ids) < MOVE_BATCH:
                    await self._truncate(slot)
                    break
            else:
                self.picker.draining(slot)
        if moved:
            self.picker.moved()
        return moved

    async def _truncate(self, slot: int) -> bool:
        """TRUNCATE ring ``slot`` if it holds no message and takes room: under its
        ACCESS EXCLUSIVE lock, taken only if free (a producer that inserted
        there, a claim that reads it, a pg_dump: try again next pass)."""
        params = _emptying(slot)
        [(empty, size)] = await self.statements.fetch(_EMPTY, params)
        if not empty or not size:
            return False
        name = pgsql.Identifier(params["partition"])
        async with self.statements.translated(), self.statements.pool.connection() as conn:
            try:
                async with conn.transaction():
                    # Claims that read every partition (a key's head check)
                    # wait for this lock: it is held as briefly as can be, and
                    # the commit does not wait for the WAL to reach the disk
                    # (a TRUNCATE a crash loses leaves dead rows, emptied again).
                    lock = pgsql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE")
                    await conn.execute(_UNSYNCED)
                    await conn.execute(_LOCK_WAIT)
                    await conn.execute(lock.format(name))
                    cur = await conn.execute(_EMPTY, params)
                    row = await cur.fetchone()
                    if not row or not row[0]:
                        return False
                    await conn.execute(pgsql.SQL("TRUNCATE {}").format(name))
            except psycopg.errors.LockNotAvailable:
                # A claim or an autovacuum holds it for an instant: tried again
                # at the next pass. Refused again and again, less often.
                refusals = self._refused.get(slot, (0, 0))[0] + 1
                skip = 0 if refusals < REFUSALS else min(2 ** (refusals - REFUSALS), REFUSED_SKIP)
                self._refused[slot] = (refusals, skip)
                log.debug("ring slot %d is in use; left alone for %d passes", slot, skip)
                return False
        self._refused.pop(slot, None)
        log.debug("ring slot %d emptied (%d bytes)", slot, size)
        return True


def _emptying(slot: int) -> dict[str, Any]:
    """ring_empty's parameters for ring ``slot``."""
    return {"slot": slot, "partition": f"outbox_messages_{slot}"}


def set_period(conn: psycopg.Connection[Any], seconds: int) -> None:
    """Make each ring slot ``seconds`` long (as the role that owns the outbox:
    the insert's default and outbox_ring change together). Relays follow
    within REFRESH seconds; the slots being emptied may wait a turn."""
    if not 0 < seconds <= 3600:
        raise ValueError("a ring slot lasts from 1 to 3600 seconds")
    with conn.transaction():
        cur = conn.execute("SELECT slots FROM outbox_ring")
        row = cur.fetchone()
        slots = int(row[0]) if row else 2
        default = pgsql.SQL(
            "ALTER TABLE outbox_messages ALTER COLUMN slot SET DEFAULT "
            "(floor(extract(epoch FROM clock_timestamp()) / {})::bigint % {})::smallint"
        ).format(pgsql.Literal(seconds), pgsql.Literal(slots))
        conn.execute(default)
        conn.execute("UPDATE outbox_ring SET seconds = %s", (seconds,))
