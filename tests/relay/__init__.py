"""The in-process relay harness: a Relay over a store, its clock a field the test
moves, its metrics in a registry of its own, and the adds and reads tests repeat.

Contract, kind and mail tests build their fixtures on it (subclasses add what
their subject needs: a dispatching handler, the handler kinds, a receiver).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from outbox import Message, NotFound, Relay, RelayConfig, Store, new_message
from outbox.handler import Handler, HandlerKind
from outbox.tracing import DeliveryTracer
from tests.clock import T0

__all__ = ["Harness"]


class Harness:
    """A relay over ``store`` whose clock is ``self.now`` (T0 to start with)."""

    def __init__(
        self,
        store: Store[Any],
        handlers: Mapping[str, Handler] | None = None,
        *,
        kinds: Mapping[str, HandlerKind] | None = None,
        tracer: DeliveryTracer | None = None,
        **config: Any,
    ) -> None:
        self.store = store
        self.now: dt.datetime = T0
        self.registry = CollectorRegistry()
        self.relay = Relay(
            store,
            handlers or {},
            RelayConfig.model_validate(config),
            clock=lambda: self.now,
            registry=self.registry,
            kinds=kinds,
            tracer=tracer,
        )

    async def put(self, *msgs: Message) -> list[Message]:
        """Add ``msgs`` in one transaction."""
        async with self.store.begin() as tx:
            await self.store.add(tx, *msgs)
        return list(msgs)

    async def add_one(
        self, topic: str, payload: Any, *, key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Message:  # fmt: skip
        """A message of ``topic`` created now, added in a transaction of its own."""
        [m] = await self.put(new_message(topic, payload, self.now, key=key, headers=headers))
        return m

    def metric(self, name: str, topic: str) -> float:
        """The relay's sample ``name`` for ``topic`` (0 when it has none yet)."""
        return self.registry.get_sample_value(name, {"topic": topic}) or 0.0

    async def gone(self, msgs: Iterable[Message]) -> bool:
        """Whether none of ``msgs`` is in the store any more (each was acked)."""
        for m in msgs:
            try:
                await self.store.get(m.id)
            except NotFound:
                continue
            return False
        return True
