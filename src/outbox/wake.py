"""Wake-ups: relays LISTEN on one channel; producers notify after they commit.

A notification never rides inside the producer's transaction (NOTIFY there
serialises every commit on one lock). It is sent after the commit, at most
once a ``WAKE_WINDOW`` per process and topic; a relay woken claims at once and
once more a window later, which covers what the window's other commits added.
A lost notification costs at most one poll interval: polling stays the floor.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable

__all__ = ["CHANNEL", "WAKES", "WAKE_WINDOW", "Wakes", "decode_topics", "encode_topics"]

log = logging.getLogger("outbox.wake")

CHANNEL = "outbox_messages"
"""The channel relays LISTEN on."""

WAKE_WINDOW = 0.005
"""Seconds: the most a notification is held back, and a woken relay's second look."""

_LIMIT = 7000  # NOTIFY payloads must stay under 8000 bytes


def encode_topics(topics: set[str] | frozenset[str]) -> str:
    """The payload for ``topics``: comma-separated; empty (any topic) when too long."""
    text = ",".join(sorted(topics))
    return "" if len(text.encode()) > _LIMIT else text


def decode_topics(payload: str) -> frozenset[str] | None:
    """The topics a payload names; None for any."""
    topics = frozenset(t for t in payload.split(",") if t)
    return topics or None


_PRUNE_AT = 1024
_NONE: frozenset[str] = frozenset()


class Wakes:
    """Which topics this process should announce now: each at most once a window.

    Thread-safe. ``send`` reserves the topics due for a notification, calls
    ``notify(payload)`` and, when it fails, gives the reservation back; it never
    raises, since the application's transaction has already committed.
    """

    def __init__(
        self, window: float = WAKE_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def reserve(self, topics: Collection[str]) -> frozenset[str]:
        """The topics not announced within the window; marked as announced now."""
        now = self.clock()
        last, window = self._last, self.window
        # A first look without the lock: most commits come within a window of
        # the last notification of their topics, and then nothing is due.
        for t in topics:
            if now - last.get(t, -math.inf) >= window:
                break
        else:
            return _NONE
        with self._lock:
            due = frozenset(t for t in topics if now - self._last.get(t, -math.inf) >= self.window)
            for t in due:
                self._last[t] = now
            if len(self._last) > _PRUNE_AT:
                # Entries older than the window decide nothing: drop them, so a
                # producer that invents topics keeps a table of one window's.
                self._last = {t: at for t, at in self._last.items() if now - at < self.window}
        return due

    def forget(self) -> None:
        """Forget every announcement: the next commit of any topic notifies."""
        with self._lock:
            self._last.clear()

    def release(self, topics: Iterable[str]) -> None:
        with self._lock:
            for t in topics:
                self._last.pop(t, None)

    def send(self, topics: Collection[str], notify: Callable[[str], object]) -> bool:
        """Notify for ``topics`` unless each was announced within the window; True if sent."""
        due = self.reserve(topics)
        if not due:
            return False
        try:
            notify(encode_topics(due))
        except Exception as exc:
            self.release(due)
            log.debug("wake-up not sent (relays poll instead): %s", exc)
            return False
        return True

    async def send_async(
        self, topics: Collection[str], notify: Callable[[str], Awaitable[object]]
    ) -> bool:
        """send(), for a ``notify`` that returns an awaitable."""
        due = self.reserve(topics)
        if not due:
            return False
        try:
            await notify(encode_topics(due))
        except Exception as exc:
            self.release(due)
            log.debug("wake-up not sent (relays poll instead): %s", exc)
            return False
        return True


WAKES = Wakes()
"""This process's wake-ups, shared by every producer API."""
