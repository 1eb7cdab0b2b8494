"""The handler contract: what delivers a message, and what builds one from a topic's config.

A leaf (no third-party import): handler kinds, the controller's validation and
the relay all speak it, and none of them needs the others to.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from outbox.message import Message

__all__ = ["AsyncHandler", "Handler", "HandlerKind"]

Handler = Callable[[Message], Awaitable[None]] | Callable[[Message], None]
"""Delivers one message: ``async def`` or plain ``def``. Raising makes the relay
retry it; Permanent buries it."""

HandlerKind = Callable[[Mapping[str, Any]], Handler]
"""A generic handler (``log``, ``webhook``): builds one from a topic's registry config;
raises ValueError for a config it cannot use."""

AsyncHandler = Callable[[Message], Awaitable[None]]
"""A handler the relay awaits (plain ``def`` handlers are wrapped into one)."""
