"""The operator console's JSON API (``/api/v1``), over the console's
operations: the same store operations ``outbox buried``, ``outbox keys`` and
``outbox relays`` run (docs/operators/console.md is the contract).

A viewer reads; an operator also reveals payloads, requeues, purges, pauses
and resumes. Errors are JSON ``{"error": ...}`` with their status. Every read
is bounded: request bodies, ids a request, page sizes, and each store call's
deadline.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from aiohttp import web

from outbox.errors import QueryTooBroad
from outbox.requests import MessageQuery
from outbox.service.admin.output import iso
from outbox.service.admin.relays import relay_record
from outbox.service.ui import inputs
from outbox.service.ui.access import Access, Visitor
from outbox.service.ui.inputs import Refused
from outbox.service.ui.operations import Governed, Operations
from outbox.service.ui.tokens import Identity
from outbox.store import Store, StoredMessage

__all__ = ["MAX_BODY", "Api"]

MAX_BODY = 64 * 1024
"""Largest request body accepted (413 beyond)."""


class Api:
    """The ``/api/v1`` routes."""

    def __init__(self, store: Store[Any], operations: Operations, access: Access) -> None:
        self.store = store
        self.operations = operations
        self.access = access

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/v1/topics", self._topics)
        router.add_get("/api/v1/relays", self._relays)
        router.add_get("/api/v1/keys/blocked", self._keys_blocked)
        router.add_get("/api/v1/messages", self._messages)
        router.add_get("/api/v1/messages/{id}", self._message)
        router.add_post("/api/v1/buried/requeue", self._requeue)
        router.add_post("/api/v1/buried/purge", self._purge)
        router.add_post("/api/v1/topics/{topic}/pause", self._pause)
        router.add_post("/api/v1/topics/{topic}/resume", self._resume)

    def _caller(self, request: web.Request) -> Visitor:
        visitor = self.access.visitor(request)
        if visitor is None:
            raise Refused(401, "send Authorization: Bearer TOKEN (a token of the tokens file)")
        return visitor

    def _operator(self, request: web.Request) -> Identity:
        visitor = self._caller(request)
        if not visitor.identity.operates:
            raise Refused(403, f"{visitor.identity.name} is a viewer: this needs the operator role")
        self.access.check_change(request, visitor, None)
        return visitor.identity

    # -- reads --------------------------------------------------------------------------

    async def _topics(self, request: web.Request) -> web.Response:
        """Every topic's counts, from the relays' shared measurement (``measured_at``
        says when); ``?count=1`` counts now, once, within a deadline."""
        self._caller(request)
        overview = await self.operations.overview(
            count=request.query.get("count") == "1", when_missing=True
        )
        out = []
        for row in overview.topics:
            record = row.record(overview.now)
            record["measured_at"] = iso(overview.measured_at)
            out.append(record)
        return web.json_response(out)

    async def _relays(self, request: web.Request) -> web.Response:
        self._caller(request)
        out = [relay_record(r) for r in await self.operations.relays()]
        return web.json_response(out)

    async def _keys_blocked(self, request: web.Request) -> web.Response:
        self._caller(request)
        topic = request.query.get("topic")
        if topic is not None:
            inputs.topic(topic)
        limit = inputs.limit(request.query.get("limit"))
        keys = await self.store.keys_blocked(topic=topic, limit=limit)
        out = [
            {
                "topic": k.topic,
                "key": k.key,
                "head": str(k.head),
                "buried": k.buried,
                "since": iso(k.since),
                "waiting": k.waiting,
                "reason": k.reason,
            }
            for k in keys
        ]
        return web.json_response(out)

    async def _messages(self, request: web.Request) -> web.Response:
        """A page of messages in the order of their ids; ``next`` reads on."""
        identity = self._caller(request).identity
        q = request.query
        after, after_due = inputs.cursor(q.get("after"))
        query = MessageQuery(
            state=inputs.state(q.get("state")),
            topic=None if q.get("topic") is None else inputs.topic(q["topic"]),
            key=inputs.key(q.get("key")),
            after=after,
            after_due=after_due,
            limit=inputs.limit(q.get("limit")),
        )
        try:
            page = await self.store.list_messages(query)
        except QueryTooBroad as exc:
            raise Refused(422, str(exc).removeprefix("outbox: ")) from None
        now = dt.datetime.now(dt.UTC)
        messages = [_described(s, now, identity) for s in page]
        more = len(page) == query.limit
        following = inputs.next_cursor(page[-1], query.state) if more else None
        return web.json_response({"messages": messages, "next": following})

    async def _message(self, request: web.Request) -> web.Response:
        """One message; its payload only for an operator who asks (``payload=1``),
        each reveal audit-logged (payloads hold one-time codes)."""
        identity = self._caller(request).identity
        wanted = inputs.message_id(request.match_info["id"])
        reveal = request.query.get("payload") == "1"
        if reveal:
            if not identity.operates:
                raise Refused(403, f"{identity.name} is a viewer: payloads need the operator role")
            stored = await self.operations.reveal(identity, wanted)
        else:
            stored = await self.store.get(wanted)
        out = _described(stored, dt.datetime.now(dt.UTC), identity)
        out["size"] = len(stored.message.payload)
        if reveal:
            out["payload"] = stored.message.payload.decode("utf-8", "replace")
        return web.json_response(out)

    # -- changes ----------------------------------------------------------------------

    async def _requeue(self, request: web.Request) -> web.Response:
        return await self._buried_action(request, "requeue")

    async def _purge(self, request: web.Request) -> web.Response:
        return await self._buried_action(request, "purge")

    async def _pause(self, request: web.Request) -> web.Response:
        return await self._enable(request, enabled=False)

    async def _resume(self, request: web.Request) -> web.Response:
        return await self._enable(request, enabled=True)

    async def _enable(self, request: web.Request, *, enabled: bool) -> web.Response:
        """Pause or resume a topic, as `outbox topics pause|resume` does. A topic an
        OutboxTopic governs is the resource's (GitOps owns it): 409 naming it
        and the `kubectl patch` that does it there, unless ``?force=1``, which
        writes an operator's override (``outbox topics delete`` releases it)."""
        identity = self._operator(request)
        topic = inputs.topic(request.match_info["topic"])
        force = request.query.get("force") == "1"
        try:
            governed = await self.operations.enable(identity, topic, enabled=enabled, force=force)
        except Governed as exc:
            raise Refused(409, str(exc)) from None
        return web.json_response({"topic": topic, "paused": not enabled, "override": governed})

    async def _buried_action(self, request: web.Request, action: str) -> web.Response:
        """A requeue or purge of what a filter selects: the dry run counts (and says
        as of which burial, the confirmed action's ``buried_by``); the action
        counts first too and acts only on what was buried by then."""
        identity = self._operator(request)
        body = await _json_body(request)
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise Refused(400, "dry_run must be true or false")
        selection, named = inputs.selection(body.get("filter"))
        if dry_run:
            found = await self.operations.count_buried(selection)
            return web.json_response({"count": found.count, "as_of": iso(found.as_of)})
        done = await self.operations.act_on_buried(identity, action, selection, named)
        return web.json_response({"count": done})


def _described(stored: StoredMessage, now: dt.datetime, identity: Identity) -> dict[str, Any]:
    """A message as the API shows it: never its payload; header values only to
    an operator (a viewer sees their names)."""
    m = stored.message
    headers: dict[str, str | None] = (
        dict(m.headers) if identity.operates else dict.fromkeys(m.headers)
    )
    return {
        "id": str(m.id),
        "topic": m.topic,
        "key": m.key,
        "state": stored.state(now),
        "attempts": m.attempts,
        "created_at": iso(m.created_at),
        "due_at": iso(stored.due_at),
        "leased_until": iso(stored.leased_until),
        "buried_at": iso(stored.buried_at),
        "last_error": stored.last_error,
        "requeues": stored.requeues,
        "headers": headers,
        "size": stored.size,
    }


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()  # at most MAX_BODY: aiohttp refuses more with 413
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body
