"""Who is asking, and whether a change may come from where it came.

Three ways in, tried in this order:

- ``Authorization: Bearer TOKEN``: an API client, by the tokens file;
- a session cookie: a browser that signed in with a token. The cookie is
  signed (HMAC-SHA256) with OUTBOX_UI_SESSION_KEY (a key per process without
  it), lasts at most 12 hours, and keeps a fingerprint of its token, so a
  token removed from the file ends its sessions; signing out ends it at once
  in this process (and removes the cookie);
- an authenticating proxy's identity and group headers, believed only from
  OUTBOX_UI_PROXY_ADDRESSES, groups mapped to roles.

Without tokens or a proxy every visitor is a viewer (the console listens on
loopback only). A change carried by a cookie or a proxy's headers, which a
browser sends by itself, must be same-origin (Sec-Fetch-Site, else Origin) and
carry the session's CSRF token; a bearer request needs neither.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections.abc import Callable

from aiohttp import web

from outbox.service.ui.tokens import ANONYMOUS, Identity, Role, TokenFile, token_fingerprint

__all__ = ["COOKIE", "SESSION_LIFETIME", "Access", "Denied", "Proxy", "Visitor"]

COOKIE = "outbox_ui_session"
SESSION_LIFETIME = 12 * 3600
"""A session's longest life, in seconds."""
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Denied(Exception):
    """A request refused with ``status`` (401: who are you; 403: not you, not this)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True, slots=True)
class Visitor:
    """Who sent a request and how: ``csrf`` is the token its forms carry (None
    for a bearer client and an anonymous visitor, which need none)."""

    identity: Identity
    via: str
    """"bearer", "session", "proxy" or "anonymous"."""
    csrf: str | None = None
    session: str | None = None
    """The session's id (to sign out of)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Proxy:
    """An authenticating proxy: where it sends from, its headers, and which of
    its groups operate and which view (``*``: every user)."""

    networks: tuple[Network, ...]
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    operators: frozenset[str] = frozenset()
    viewers: frozenset[str] = frozenset()

    def trusts(self, address: str | None) -> bool:
        if address is None:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def role(self, groups: set[str]) -> Role | None:
        if groups & self.operators:
            return Role.OPERATOR
        if "*" in self.viewers or groups & self.viewers:
            return Role.VIEWER
        return None


class Access:
    """Authenticates requests and checks where changes come from."""

    def __init__(
        self,
        tokens: TokenFile | None,
        *,
        session_key: bytes | None = None,
        proxy: Proxy | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tokens = tokens
        self.proxy = proxy
        self.key = session_key or secrets.token_bytes(32)
        self.clock = clock
        self._ended: dict[str, float] = {}
        """Sessions signed out of, until they would have expired anyway."""

    @property
    def open(self) -> bool:
        """No authentication: every visitor is an anonymous viewer."""
        return self.tokens is None and self.proxy is None

    # -- who ----------------------------------------------------------------------------

    def visitor(self, request: web.Request) -> Visitor | None:
        """Who sent ``request``; None: nobody signed in (401 for the API, the
        sign-in form for a page). Denied for a proxy user without a role."""
        if self.open:
            return Visitor(ANONYMOUS, "anonymous")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.tokens is not None:
            identity = self.tokens.who(token.strip())
            if identity is None:
                raise Denied(401, "the bearer token is not one of the tokens file's")
            return Visitor(identity, "bearer")
        found = self._session(request.cookies.get(COOKIE))
        if found is not None:
            return found
        return self._proxied(request)

    def _proxied(self, request: web.Request) -> Visitor | None:
        proxy = self.proxy
        if proxy is None or not proxy.trusts(request.remote):
            return None
        user = request.headers.get(proxy.user_header, "").strip()
        if not user:
            return None
        groups = {g.strip() for g in request.headers.get(proxy.groups_header, "").split(",")}
        role = proxy.role(groups - {""})
        if role is None:
            raise Denied(403, f"{user} is in no group the console gives a role to")
        name = user[:200]
        return Visitor(Identity(name, role), "proxy", csrf=self._sign(f"proxy:{name}")[:32])

    # -- sessions -----------------------------------------------------------------------

    def sign_in(self, token: str) -> tuple[Identity, str] | None:
        """The identity ``token`` stands for and a session cookie's value for it."""
        if self.tokens is None:
            return None
        identity = self.tokens.who(token)
        if identity is None:
            return None
        body = {
            "n": identity.name,
            "r": identity.role.value,
            "t": token_fingerprint(token.encode()),
            "e": int(self.clock()) + SESSION_LIFETIME,
            "s": secrets.token_urlsafe(12),
        }
        raw = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode())
        value = raw.decode().rstrip("=")
        return identity, f"{value}.{self._sign(value)}"

    def sign_out(self, visitor: Visitor) -> None:
        if visitor.session is not None:
            now = self.clock()
            self._ended = {s: e for s, e in self._ended.items() if e > now}
            self._ended[visitor.session] = now + SESSION_LIFETIME

    def _session(self, cookie: str | None) -> Visitor | None:
        if not cookie or self.tokens is None or len(cookie) > 1024:
            return None
        value, _, signature = cookie.rpartition(".")
        if not value or not hmac.compare_digest(signature, self._sign(value)):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
            name, role, fingerprint = str(body["n"]), Role(body["r"]), str(body["t"])
            expires, session = int(body["e"]), str(body["s"])
        except (ValueError, KeyError, TypeError):
            return None
        if expires <= self.clock() or session in self._ended:
            return None
        identity = self.tokens.still(Identity(name, role), fingerprint)
        if identity is None:
            return None
        csrf = self._sign(f"csrf:{session}")[:32]
        return Visitor(identity, "session", csrf=csrf, session=session)

    def _sign(self, value: str) -> str:
        return hmac.new(self.key, value.encode(), hashlib.sha256).hexdigest()

    # -- where changes come from --------------------------------------------------------

    def secure(self, request: web.Request) -> bool:
        """Whether the browser reached us over TLS (X-Forwarded-Proto believed
        only from the proxy's addresses)."""
        if self.proxy is not None and self.proxy.trusts(request.remote):
            forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip()
            if forwarded:
                return forwarded.lower() == "https"
        return request.secure

    def check_change(self, request: web.Request, visitor: Visitor, form_token: str | None) -> None:
        """Refuse a change a browser may have been made to send: one carried by a
        cookie or a proxy's headers must be same-origin and carry the CSRF token."""
        if visitor.csrf is None:
            return
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None:
            if site != "same-origin":
                raise Denied(403, f"a cross-site request ({site}) changes nothing")
        else:
            origin = request.headers.get("Origin")
            scheme = "https" if self.secure(request) else "http"
            if origin is None or origin != f"{scheme}://{request.host}":
                raise Denied(403, "a request from another origin changes nothing")
        given = form_token or request.headers.get(CSRF_HEADER) or ""
        if not hmac.compare_digest(given, visitor.csrf):
            raise Denied(403, "the form's CSRF token is missing or stale: reload the page")
