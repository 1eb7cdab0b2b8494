"""What one relay holds: the messages it claimed and has not settled, and the wait for room.

One owner for the three things the feeder, the workers and the settler share:
the held messages (and their payload bytes, which bound a relay's memory),
each capped topic's deliveries in flight (``maxInFlight``), and the event
that wakes whoever waits for room, a worker or an outcome.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Callable

import anyio

from outbox.message import Message
from outbox.relay.routing import Route

__all__ = ["Held", "InFlight"]


@dataclasses.dataclass(slots=True, eq=False)
class Held:
    """A message this relay has claimed and not yet settled."""

    message: Message
    route: Route | None
    """How its topic is delivered (None: no route serves its topic any more, the
    registry changed since the claim; it is released for another relay)."""
    lease_end: float
    """When its lease ends, on the monotonic clock (a little early: measured
    before the claim was sent)."""
    solo: bool = False
    decided: bool = False
    """Its outcome is known (queued for writing, or written)."""
    acked: bool = False
    """Its ack is in the store (a key's next message waits for it)."""
    followed: bool = False
    """This relay holds the next message of its key (its ack unparks nothing)."""
    settled: bool = False
    """Its outcome's write is over (done, fenced out, or given up)."""


class InFlight:
    """The messages a relay holds, from its claim until their outcome is written."""

    def __init__(self) -> None:
        self.held: dict[uuid.UUID, Held] = {}
        self.bytes = 0
        """Payload bytes of the messages held."""
        self.load: collections.Counter[str] = collections.Counter()
        """Undecided deliveries of each topic that has a cap (maxInFlight)."""
        self._changed: anyio.Event | None = None

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, held: Held) -> None:
        """``held`` was claimed: it takes a slot, its bytes and its topic's load."""
        m = held.message
        self.held[m.id] = held
        self.bytes += len(m.payload)
        if held.route is not None and held.route.max_in_flight is not None:
            self.load[m.topic] += 1

    def decide(self, held: Held) -> None:
        """``held`` has an outcome: its delivery no longer counts against its topic."""
        if held.decided:
            return
        held.decided = True
        route = held.route
        if route is not None and route.max_in_flight is not None:
            self.load[held.message.topic] -= 1
            self.signal()

    def free(self, held: Held) -> bool:
        """``held``'s outcome is in the store (or given up): free its slot and
        bytes; whether it was held until now."""
        if self.held.pop(held.message.id, None) is None:
            return False
        self.bytes -= len(held.message.payload)
        self.signal()
        return True

    def undecided(self) -> list[Held]:
        return [held for held in self.held.values() if not held.decided]

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds (looked at again whenever :meth:`signal` is
        called: a slot, bytes, a topic's load or a worker freed, or the relay stops)."""
        while not condition():
            self._changed = anyio.Event()
            if condition():
                break
            await self._changed.wait()

    def signal(self) -> None:
        if self._changed is not None and not self._changed.is_set():
            self._changed.set()
