"""The console's HTML pages: server-rendered (Jinja2, autoescaped), plain
forms, no script. Each view is a URL that can be pasted into an incident
channel; every change goes through the same operations as the API.

A browser signs in by pasting a token (a session cookie follows) or arrives
through an authenticating proxy; every form that changes something carries
the session's CSRF token and must come from the same origin (access.py).
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Mapping
from typing import Any

import jinja2
from aiohttp import web

from outbox.errors import QueryTooBroad
from outbox.requests import MESSAGE_STATES, MessageQuery
from outbox.service.admin.output import iso
from outbox.service.ui import inputs
from outbox.service.ui.access import COOKIE, SESSION_LIFETIME, Access, Denied, Visitor
from outbox.service.ui.inputs import Refused
from outbox.service.ui.operations import Governed, Operations
from outbox.store import BuriedFilter, Store

__all__ = ["Pages"]

KEY_PLACES = 500
"""How many of a key's messages a message's page reads to tell its place."""


class Pages:
    """The HTML routes, under ``base`` (the ingress path prefix, or empty)."""

    def __init__(
        self,
        store: Store[Any],
        operations: Operations,
        access: Access,
        *,
        base: str = "",
        trace_url: str | None = None,
        charts: bool = False,
        hours: int = 6,
    ) -> None:
        self.store = store
        self.operations = operations
        self.access = access
        self.base = base
        self.trace_url = trace_url
        self.charts = charts
        self.hours = hours
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("outbox.service.ui", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["when"] = _when
        self.env.filters["age"] = _age

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/signin", self._signin_form)
        router.add_post("/signin", self._signin)
        router.add_post("/signout", self._signout)
        router.add_get("/", self._overview)
        router.add_get("/messages", self._messages)
        router.add_get("/messages/{id}", self._message)
        router.add_post("/messages/{id}/reveal", self._reveal)
        router.add_get("/buried", self._buried)
        router.add_post("/buried/confirm", self._confirm)
        router.add_post("/buried/act", self._act)
        router.add_get("/keys", self._keys)
        router.add_get("/relays", self._relays)
        router.add_get("/topics", self._topics)
        router.add_post("/topics/{topic}/{action:pause|resume|release}", self._topic_action)

    # -- rendering ----------------------------------------------------------------------

    async def render(
        self,
        name: str,
        request: web.Request,
        visitor: Visitor | None,
        status: int = 200,
        **ctx: Any,
    ) -> web.Response:
        """The page ``name``; its change buttons only for an operator whose
        console's database role may change things."""
        operates = visitor is not None and visitor.identity.operates
        page = self.env.get_template(name).render(
            changes=operates and await self.operations.writable(),
            base=self.base,
            here=ctx.pop("here", None),
            visitor=visitor,
            notice=ctx.pop("notice", None) or request.query.get("notice"),
            notice_kind=ctx.pop("notice_kind", None),
            **ctx,
        )
        headers = {
            "Content-Security-Policy": (
                "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                "frame-ancestors 'none'; base-uri 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        }
        return web.Response(text=page, status=status, content_type="text/html", headers=headers)

    async def error(
        self, request: web.Request, status: int, message: str, command: str | None = None
    ) -> web.Response:
        try:
            visitor = self.access.visitor(request)
        except Denied:
            visitor = None
        return await self.render(
            "error.html", request, visitor, status, code=status, message=message, command=command
        )

    # -- who ----------------------------------------------------------------------------

    def _visitor(self, request: web.Request) -> Visitor:
        visitor = self.access.visitor(request)
        if visitor is None:
            if self.access.tokens is None:
                raise Denied(401, "sign in through the console's authenticating proxy")
            wanted = request.rel_url.path_qs
            target = f"{self.base}/signin?next={urllib.parse.quote(wanted, safe='')}"
            raise web.HTTPSeeOther(target)
        return visitor

    async def _changer(self, request: web.Request) -> tuple[Visitor, Any]:
        """The operator sending a form, and the form: refused unless same-origin
        with the session's CSRF token."""
        visitor = self._visitor(request)
        form = await request.post()
        self.access.check_change(request, visitor, _text(form.get("csrf")))
        if not visitor.identity.operates:
            raise Denied(403, f"{visitor.identity.name} is a viewer: this needs the operator role")
        return visitor, form

    async def _signin_form(self, request: web.Request) -> web.Response:
        if self.access.tokens is None:
            raise web.HTTPSeeOther(f"{self.base}/")
        return await self.render(
            "signin.html", request, None, next=_next(request.query.get("next"))
        )

    async def _signin(self, request: web.Request) -> web.StreamResponse:
        if self.access.tokens is None:
            raise web.HTTPSeeOther(f"{self.base}/")
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site != "same-origin":
            raise Denied(403, f"a cross-site sign-in ({site}) is refused")
        form = await request.post()
        signed = self.access.sign_in(_text(form.get("token")) or "")
        target = _next(_text(form.get("next")))
        if signed is None:
            return await self.render(
                "signin.html",
                request,
                None,
                401,
                next=target,
                notice="That token is not one of the tokens file's.",
                notice_kind="bad",
            )
        _, cookie = signed
        response = web.HTTPSeeOther(target or f"{self.base}/")
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=SESSION_LIFETIME,
            path=f"{self.base}/",
            httponly=True,
            samesite="Strict",
            secure=self.access.secure(request),
        )
        raise response

    async def _signout(self, request: web.Request) -> web.StreamResponse:
        visitor = self._visitor(request)
        form = await request.post()
        self.access.check_change(request, visitor, _text(form.get("csrf")))
        self.access.sign_out(visitor)
        response = web.HTTPSeeOther(f"{self.base}/signin")
        response.del_cookie(COOKIE, path=f"{self.base}/")
        raise response

    # -- views ----------------------------------------------------------------------------

    async def _overview(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        topic = request.query.get("topic") or None
        if topic is not None:
            inputs.topic(topic)
        counted = request.query.get("count") == "1"
        overview = await self.operations.overview(count=counted)
        return await self.render(
            "overview.html",
            request,
            visitor,
            here="/",
            overview=overview,
            measured=_when(overview.measured_at),
            stale=overview.stale,
            counted=counted,
            topic=topic,
            charts=self.charts,
            hours=self.hours,
        )

    async def _messages(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        q = request.query
        if q.get("id"):
            wanted = inputs.message_id(q["id"].strip())
            raise web.HTTPSeeOther(f"{self.base}/messages/{wanted}")
        query = _listing(q, inputs.state(q.get("state") or None))
        page = await self._listed(query)
        return await self.render(
            "messages.html",
            request,
            visitor,
            here="/messages",
            q=query,
            older_than=q.get("older_than", ""),
            states=MESSAGE_STATES,
            messages=page,
            now=dt.datetime.now(dt.UTC),
            next=self._next_page(request, page, query.limit),
        )

    async def _listed(self, query: MessageQuery) -> list[Any]:
        try:
            return await self.store.list_messages(query)
        except QueryTooBroad as exc:
            raise Refused(422, str(exc).removeprefix("outbox: ")) from None

    def _next_page(self, request: web.Request, page: list[Any], limit: int) -> str | None:
        if len(page) < limit:
            return None
        query = dict(request.query)
        query["after"] = inputs.next_cursor(page[-1], request.query.get("state") or None)
        return f"{self.base}{request.path.removeprefix(self.base)}?{urllib.parse.urlencode(query)}"

    async def _message(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        wanted = inputs.message_id(request.match_info["id"])
        return await self._show(request, visitor, await self.store.get(wanted), None)

    async def _reveal(self, request: web.Request) -> web.Response:
        visitor, _ = await self._changer(request)
        wanted = inputs.message_id(request.match_info["id"])
        stored = await self.operations.reveal(visitor.identity, wanted)
        payload = stored.message.payload.decode("utf-8", "replace")
        return await self._show(request, visitor, stored, payload)

    async def _show(
        self, request: web.Request, visitor: Visitor, stored: Any, payload: str | None
    ) -> web.Response:
        m = stored.message
        place = None
        if m.key is not None:
            mates = await self._listed(MessageQuery(topic=m.topic, key=m.key, limit=KEY_PLACES))
            ids = [s.message.id for s in mates]
            place = (
                f"{ids.index(m.id) + 1} of {len(ids)}{'+' if len(ids) == KEY_PLACES else ''}"
                if m.id in ids
                else f"beyond the first {KEY_PLACES}"
            )
        return await self.render(
            "message.html",
            request,
            visitor,
            here="/messages",
            s=stored,
            m=m,
            state=stored.state(dt.datetime.now(dt.UTC)),
            place=place,
            size=len(m.payload) if payload is not None else stored.size,
            payload=payload,
            trace=self._trace(m.headers),
        )

    def _trace(self, headers: dict[str, str]) -> str | None:
        parts = headers.get("traceparent", "").split("-")
        if self.trace_url is None or len(parts) != 4 or len(parts[1]) != 32:
            return None
        if not all(c in "0123456789abcdef" for c in parts[1]):
            return None
        return self.trace_url.replace("{trace_id}", parts[1])

    async def _buried(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        q = request.query
        query = _listing(q, "buried")
        page = await self._listed(query)
        return await self.render(
            "buried.html",
            request,
            visitor,
            here="/buried",
            f=query,
            older_than=q.get("older_than", ""),
            messages=page,
            now=dt.datetime.now(dt.UTC),
            next=self._next_page(request, page, query.limit),
        )

    async def _confirm(self, request: web.Request) -> web.Response:
        """The dry run: how many a requeue or purge would act on, as of when."""
        visitor, form = await self._changer(request)
        action = _action(form)
        selection, named, fields = _form_filter(form)
        found = await self.operations.count_buried(selection)
        return await self.render(
            "confirm.html",
            request,
            visitor,
            here="/buried",
            action=action,
            count=found.count,
            as_of=iso(found.as_of) or "",
            fields=fields,
            described=_described(selection, named),
            back=f"{self.base}/buried",
        )

    async def _act(self, request: web.Request) -> web.Response:
        visitor, form = await self._changer(request)
        action = _action(form)
        selection, named, _ = _form_filter(form)
        if selection.buried_by is None:
            raise Refused(400, "confirm a count first (the form has no buried_by)")
        done = await self.operations.act_on_buried(visitor.identity, action, selection, named)
        verb = "Requeued" if action == "requeue" else "Purged"
        notice = f"{verb} {done} message{'' if done == 1 else 's'}."
        raise web.HTTPSeeOther(f"{self.base}/buried?{urllib.parse.urlencode({'notice': notice})}")

    async def _keys(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        topic = request.query.get("topic") or None
        if topic is not None:
            inputs.topic(topic)
        keys = await self.store.keys_blocked(topic=topic, limit=inputs.MAX_LIMIT)
        return await self.render("keys.html", request, visitor, here="/keys", keys=keys)

    async def _relays(self, request: web.Request) -> web.Response:
        visitor = self._visitor(request)
        relays = await self.operations.relays()
        return await self.render("relays.html", request, visitor, here="/relays", relays=relays)

    async def _topics(self, request: web.Request, governed: Any = None) -> web.Response:
        visitor = self._visitor(request)
        overview = await self.operations.overview()
        status = 409 if governed else 200
        return await self.render(
            "topics.html",
            request,
            visitor,
            status,
            here="/topics",
            overview=overview,
            governed=governed,
        )

    async def _topic_action(self, request: web.Request) -> web.Response:
        visitor, _ = await self._changer(request)
        topic = inputs.topic(request.match_info["topic"])
        action = request.match_info["action"]
        if action == "release":
            await self.operations.release(visitor.identity, topic)
            notice = f"{topic}: the operator's entry is removed."
        else:
            force = request.query.get("force") == "1"
            try:
                await self.operations.enable(
                    visitor.identity, topic, enabled=action == "resume", force=force
                )
            except Governed as exc:
                return await self._topics(
                    request, {"topic": topic, "action": action, "message": str(exc)}
                )
            notice = f"{topic} {'resumed' if action == 'resume' else 'paused'}."
        raise web.HTTPSeeOther(f"{self.base}/topics?{urllib.parse.urlencode({'notice': notice})}")


def _listing(q: Mapping[str, str], state: str | None) -> MessageQuery:
    """The listing a page's filter form asks for (an empty field: any)."""
    after, after_due = inputs.cursor(q.get("after"))
    return MessageQuery(
        state=state,
        topic=None if not q.get("topic") else inputs.topic(q["topic"]),
        key=inputs.key(q.get("key") or None),
        after=after,
        after_due=after_due,
        limit=inputs.limit(q.get("limit") or None),
        error_contains=inputs.error_text(q.get("error_contains") or None),
        older_than=inputs.older_than(q.get("older_than") or None),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _next(target: str | None) -> str:
    """Where to go after signing in: a path of this site only."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return ""


def _action(form: Any) -> str:
    action = _text(form.get("action"))
    if action not in ("requeue", "purge"):
        raise Refused(400, "action must be requeue or purge")
    return action


def _form_filter(form: Any) -> tuple[BuriedFilter, list[str], list[tuple[str, str]]]:
    """The buried filter a form names (the buried page's fields, its checked
    ids, or ``all``), its field names, and the fields to carry on."""
    raw: dict[str, Any] = {}
    carried: list[tuple[str, str]] = []
    for name in ("topic", "older_than", "error_contains", "buried_by"):
        value = _text(form.get(name))
        if value:
            raw[name] = value
            if name != "buried_by":
                carried.append((name, value))
    picked = [i for v in form.getall("ids", []) if isinstance(v, str) for i in v.split()]
    if picked:
        raw["ids"] = picked
        carried += [("ids", i) for i in picked]
    if not set(raw) - {"buried_by"}:
        if _text(form.get("all")) != "1":
            raise Refused(400, "select messages, or narrow the filter (or act on all that match)")
        raw["all"] = True
        carried.append(("all", "1"))
    selection, named = inputs.selection(raw)
    return selection, [n for n in named if n != "buried_by"], carried


def _described(selection: BuriedFilter, named: list[str]) -> str:
    parts = []
    if selection.topic:
        parts.append(f"topic {selection.topic}")
    if selection.ids:
        parts.append(f"{len(selection.ids)} selected")
    if selection.older_than:
        parts.append(f"buried longer than {selection.older_than} ago")
    if selection.error_contains:
        parts.append(f"an error containing “{selection.error_contains}”")
    return "the filter: " + ", ".join(parts) if parts else "every topic (all buried messages)"


def _when(at: dt.datetime | None) -> str:
    if at is None:
        return "never"
    return f"{at.astimezone(dt.UTC).isoformat(' ', 'seconds')[:19]} UTC"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"
