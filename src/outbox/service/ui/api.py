"""The operator console's JSON API (``/api/v1``), on aiohttp, over the Store's
operator methods: the same operations ``outbox buried``, ``outbox keys`` and
``outbox relays`` run (docs/operators/console.md is the contract).

Who may do what: a viewer reads; an operator also requeues and purges. With
no tokens configured every caller is a viewer (the console then listens on
loopback only: outbox.service.cli.ui). Every change writes one audit line
(who, role, action, topic, the filter's field names, count: never a payload,
a key or the error text searched for) and counts in
``outbox_ui_actions_total{action}``. Every read is bounded: request bodies,
ids a request, page sizes, and each store call's deadline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from outbox.durations import parse_duration
from outbox.errors import NotFound, NotPermitted, OutboxError, QueryTooBroad, StoreUnavailable
from outbox.message import validate_topic
from outbox.requests import MAX_ERROR_TEXT, MAX_LISTING, MESSAGE_STATES, MessageQuery
from outbox.service.admin.output import iso
from outbox.service.admin.relays import relay_record
from outbox.service.ui.tokens import ANONYMOUS, Identity, TokenFile
from outbox.store import BuriedFilter, Store, StoredMessage, TopicSettings

__all__ = ["MAX_BODY", "MAX_IDS", "MAX_LIMIT", "Console"]

log = logging.getLogger("outbox.ui")
audit = logging.getLogger("outbox.ui.audit")

MAX_BODY = 64 * 1024
"""Largest request body accepted (413 beyond)."""
MAX_IDS = 1_000
"""Most message ids one request names."""
MAX_LIMIT = MAX_LISTING
"""Largest page a read returns."""
MAX_KEY = 1_000
"""Longest key a listing selects by."""
COUNT_AGE = dt.timedelta(minutes=1)
"""The relays' backlog count is read while younger than this; older, it is counted again."""

_FILTER_FIELDS = frozenset({"all", "topic", "ids", "older_than", "error_contains", "buried_by"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Refused(Exception):
    """A request answered with ``status`` and ``message`` (JSON ``{"error": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Console:
    """The console's API over ``store``; ``tokens`` None: no authentication."""

    def __init__(self, store: Store[Any], tokens: TokenFile | None) -> None:
        self.store = store
        self.tokens = tokens
        self.registry = CollectorRegistry()
        self.actions = Counter(
            "outbox_ui_actions",
            "Changes and payload reveals made through the console, by action.",
            ["action"],
            registry=self.registry,
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._answers])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/topics", self._topics)
        app.router.add_get("/api/v1/relays", self._relays)
        app.router.add_get("/api/v1/keys/blocked", self._keys_blocked)
        app.router.add_get("/api/v1/messages", self._messages)
        app.router.add_get("/api/v1/messages/{id}", self._message)
        app.router.add_post("/api/v1/buried/requeue", self._requeue)
        app.router.add_post("/api/v1/buried/purge", self._purge)
        app.router.add_post("/api/v1/topics/{topic}/pause", self._pause)
        app.router.add_post("/api/v1/topics/{topic}/resume", self._resume)
        return app

    # -- what every request goes through ------------------------------------------

    @web.middleware
    async def _answers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Errors as JSON ``{"error": ...}`` with their status; nothing else leaks."""
        try:
            return await handler(request)
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the body is larger than {MAX_BODY} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(exc.status, exc.reason)
            raise
        except NotFound as exc:
            return _error(404, str(exc))
        except NotPermitted as exc:
            return _error(
                403,
                "the console's database role may not do this (a read-only console: give it "
                f"the operator grants, `outbox migrate --grants operator=ROLE`): {exc}",
            )
        except StoreUnavailable as exc:
            return _error(503, str(exc).removeprefix("outbox: "))
        except OutboxError as exc:
            log.warning("console request failed: %s", exc)
            return _error(500, "the store failed; see the console's log")

    def _caller(self, request: web.Request) -> Identity:
        """Who sent ``request``: 401 without a known token (when tokens are set)."""
        if self.tokens is None:
            return ANONYMOUS
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        identity = self.tokens.who(token.strip()) if scheme.lower() == "bearer" else None
        if identity is None:
            raise _Refused(401, "send Authorization: Bearer TOKEN (a token of the tokens file)")
        return identity

    def _operator(self, request: web.Request) -> Identity:
        identity = self._caller(request)
        if not identity.operates:
            raise _Refused(403, f"{identity.name} is a viewer: this needs the operator role")
        return identity

    # -- reads --------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})

    async def _topics(self, request: web.Request) -> web.Response:
        self._caller(request)
        stats = {s.topic: s for s in await self.store.topic_stats(max_age=COUNT_AGE)}
        registry = await self.store.topics()
        now = dt.datetime.now(dt.UTC)
        out = []
        for topic in sorted(stats.keys() | registry.keys()):
            s, entry = stats.get(topic), registry.get(topic)
            oldest = s.oldest_pending if s else None
            out.append(
                {
                    "topic": topic,
                    "pending": s.pending if s else 0,
                    "in_flight": s.in_flight if s else 0,
                    "buried": s.buried if s else 0,
                    "blocked_keys": s.blocked_keys if s else 0,
                    "oldest_pending_seconds": (
                        None if oldest is None else max((now - oldest).total_seconds(), 0.0)
                    ),
                    "paused": entry is not None and not entry.enabled,
                    "handler": entry.handler if entry else None,
                }
            )
        return web.json_response(out)

    async def _relays(self, request: web.Request) -> web.Response:
        self._caller(request)
        out = [relay_record(r) for r in await self.store.relays()]
        return web.json_response(out)

    async def _keys_blocked(self, request: web.Request) -> web.Response:
        self._caller(request)
        topic = request.query.get("topic")
        if topic is not None:
            _topic(topic)
        limit = _limit(request.query.get("limit"))
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
        identity = self._caller(request)
        q = request.query
        topic = q.get("topic")
        if topic is not None:
            _topic(topic)
        state = q.get("state")
        if state is not None and state not in MESSAGE_STATES:
            raise _Refused(400, f"state must be one of {', '.join(MESSAGE_STATES)}")
        key = q.get("key")
        if key is not None and not 0 < len(key) <= MAX_KEY:
            raise _Refused(400, f"key must be 1 to {MAX_KEY} characters")
        after = None if q.get("after") is None else _id(q["after"], "after")
        limit = _limit(q.get("limit"))
        try:
            page = await self.store.list_messages(
                MessageQuery(state=state, topic=topic, key=key, after=after, limit=limit)
            )
        except QueryTooBroad as exc:
            raise _Refused(422, str(exc).removeprefix("outbox: ")) from None
        now = dt.datetime.now(dt.UTC)
        messages = [_described(s, now, identity) for s in page]
        more = len(page) == limit
        return web.json_response(
            {"messages": messages, "next": str(page[-1].message.id) if more else None}
        )

    async def _message(self, request: web.Request) -> web.Response:
        """One message; its payload only for an operator who asks (``payload=1``),
        each reveal audit-logged (payloads hold one-time codes)."""
        identity = self._caller(request)
        wanted = _id(request.match_info["id"], "the message id")
        reveal = request.query.get("payload") == "1"
        if reveal and not identity.operates:
            raise _Refused(403, f"{identity.name} is a viewer: payloads need the operator role")
        stored = await self.store.get(wanted)
        out = _described(stored, dt.datetime.now(dt.UTC), identity)
        out["size"] = len(stored.message.payload)
        if reveal:
            out["payload"] = stored.message.payload.decode("utf-8", "replace")
            self.actions.labels("reveal").inc()
            audit.info(
                "%s (%s) reveal: topic=%s message=%s",
                identity.name,
                identity.role.value,
                stored.message.topic,
                stored.message.id,
            )
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
        topic = _topic(request.match_info["topic"])
        action = "resume" if enabled else "pause"
        current = (await self.store.topics()).get(topic) or TopicSettings(topic)
        source = current.source or ""
        force = request.query.get("force") == "1"
        if source.startswith("kubernetes:") and not force:
            namespace, _, name = source.removeprefix("kubernetes:").partition("/")
            patch = json.dumps({"spec": {"enabled": enabled}})
            raise _Refused(
                409,
                f"{topic} is governed by OutboxTopic {namespace}/{name}: {action} it there, "
                f"`kubectl -n {namespace} patch outboxtopic {name} --type merge -p '{patch}'`, "
                "or force an operator's override (?force=1; outbox topics delete releases it)",
            )
        entry = dataclasses.replace(current, enabled=enabled, source="cli", reroute=True)
        await self.store.set_topic(entry)
        self.actions.labels(action).inc()
        audit.info(
            "%s (%s) %s: topic=%s%s",
            identity.name,
            identity.role.value,
            action,
            topic,
            " (an override of its OutboxTopic)" if source.startswith("kubernetes:") else "",
        )
        governed = source.startswith("kubernetes:")
        return web.json_response({"topic": topic, "paused": not enabled, "override": governed})

    async def _buried_action(self, request: web.Request, action: str) -> web.Response:
        """A requeue or purge of what a filter selects: the dry run counts (and says
        as of which burial, the confirmed action's ``buried_by``); the action
        counts first too and acts only on what was buried by then."""
        identity = self._operator(request)
        body = await _json_body(request)
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise _Refused(400, "dry_run must be true or false")
        selection, named = _selection(body.get("filter"))
        found = await self.store.count_buried(selection)
        if dry_run:
            answer = {"count": found.count, "as_of": iso(found.as_of)}
            return web.json_response(answer)
        done = 0
        if found.as_of is not None:
            acting = dataclasses.replace(
                selection,
                buried_by=found.as_of
                if selection.buried_by is None
                else min(selection.buried_by, found.as_of),
            )
            if action == "requeue":
                done = await self.store.requeue(selection=acting)
            else:
                done = await self.store.purge_buried(selection=acting)
        self.actions.labels(action).inc()
        audit.info(
            "%s (%s) %s: topic=%s filter=%s count=%d",
            identity.name,
            identity.role.value,
            action,
            selection.topic or "*",
            ",".join(named) or "all",
            done,
        )
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


def _id(text: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise _Refused(400, f"{what} must be a message id (a UUID)") from None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _topic(text: object) -> str:
    if not isinstance(text, str):
        raise _Refused(400, "topic must be a string")
    try:
        validate_topic(text)
    except ValueError as exc:
        raise _Refused(400, str(exc).removeprefix("outbox: ")) from None
    return text


def _limit(text: str | None) -> int:
    if text is None:
        return 100
    try:
        n = int(text)
    except ValueError:
        raise _Refused(400, "limit must be a whole number") from None
    if not 1 <= n <= MAX_LIMIT:
        raise _Refused(400, f"limit must be from 1 to {MAX_LIMIT}")
    return n


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()  # at most MAX_BODY: aiohttp refuses more with 413
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _selection(raw: object) -> tuple[BuriedFilter, list[str]]:
    """The BuriedFilter a request's ``filter`` names, and the names of the fields
    it gave (for the audit line). An empty filter is refused: everything is
    ``{"all": true}``, alone."""
    if not isinstance(raw, dict):
        raise _Refused(400, 'give a filter: {"topic", "ids", "older_than", "error_contains"}')
    unknown = sorted(set(raw) - _FILTER_FIELDS)
    if unknown:
        raise _Refused(400, f"unknown filter fields: {', '.join(unknown)}")
    named = sorted(k for k, v in raw.items() if k != "all" and v is not None)
    if raw.get("all") is True:
        if named:
            raise _Refused(400, '"all" selects everything: give it alone')
        return BuriedFilter(), []
    if not named:
        raise _Refused(400, 'an empty filter selects nothing; everything is {"all": true}')
    return (
        BuriedFilter(
            topic=None if raw.get("topic") is None else _topic(raw["topic"]),
            ids=_ids(raw.get("ids")),
            older_than=_older_than(raw.get("older_than")),
            error_contains=_error_text(raw.get("error_contains")),
            buried_by=_instant(raw.get("buried_by")),
        ),
        named,
    )


def _ids(raw: object) -> tuple[uuid.UUID, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise _Refused(400, "ids must be a list of message ids")
    if len(raw) > MAX_IDS:
        raise _Refused(413, f"at most {MAX_IDS} ids a request")
    try:
        return tuple(uuid.UUID(str(i)) for i in raw)
    except ValueError:
        raise _Refused(400, "ids must be message ids (UUIDs)") from None


def _older_than(raw: object) -> dt.timedelta | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise _Refused(400, 'older_than must be a duration such as "7d"')
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise _Refused(400, f"older_than: {exc}") from None


def _error_text(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_ERROR_TEXT:
        raise _Refused(400, f"error_contains must be 1 to {MAX_ERROR_TEXT} characters")
    return raw


def _instant(raw: object) -> dt.datetime | None:
    if raw is None:
        return None
    try:
        at = dt.datetime.fromisoformat(str(raw))
    except ValueError:
        raise _Refused(400, "buried_by must be an ISO 8601 instant (a dry run's as_of)") from None
    if at.tzinfo is None:
        raise _Refused(400, "buried_by needs its offset (a dry run's as_of has one)")
    return at
