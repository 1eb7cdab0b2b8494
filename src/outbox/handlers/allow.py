"""Where handler kinds may send: URL prefixes for webhooks, subject prefixes for NATS.

An OutboxTopic's author chooses the URL or subject; whoever deploys the relays
chooses where they may point (OUTBOX_WEBHOOK_ALLOW, OUTBOX_NATS_ALLOW). URL
entries are compared parsed, never as strings: scheme, host and port exactly,
the path by whole segments, so ``https://billing.internal/hooks`` admits
``/hooks`` and ``/hooks/orders`` but neither ``/hooksx`` nor
``https://billing.internal.evil.example/`` nor ``https://billing.internal@evil/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

__all__ = ["UrlPrefix", "check_name", "check_subject", "origin", "parse_url"]

_PORTS = {"http": 80, "https": 443}


def parse_url(text: str) -> SplitResult:
    """``text`` split, or ValueError when it is no http(s) URL a relay may use."""
    try:
        url = urlsplit(text.strip())
        url.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ValueError("is not a URL") from None
    if url.scheme.lower() not in _PORTS or not url.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if "@" in url.netloc:
        raise ValueError("must not carry credentials (user:password@); sign with a secret")
    if url.fragment:
        raise ValueError("must not have a #fragment")
    for segment in url.path.split("/"):
        plain = unquote(segment)
        if plain in (".", "..") or "/" in plain or "\\" in plain:
            raise ValueError("must not have . or .. or encoded slashes in its path")
    return url


def origin(url: SplitResult) -> str:
    """scheme://host[:port]: what a reason or a log line may say of a URL."""
    host = url.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = url.port
    shown = f":{port}" if port is not None and port != _PORTS.get(url.scheme.lower()) else ""
    return f"{url.scheme.lower()}://{host}{shown}"


def _segments(path: str) -> tuple[str, ...]:
    return tuple(s for s in path.split("/") if s)


@dataclass(frozen=True)
class UrlPrefix:
    """One OUTBOX_WEBHOOK_ALLOW entry."""

    scheme: str
    host: str
    port: int
    path: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> UrlPrefix:
        url = parse_url(text)
        if url.query:
            raise ValueError("an allowed prefix has no ?query")
        scheme = url.scheme.lower()
        return cls(
            scheme,
            (url.hostname or "").lower(),
            url.port or _PORTS[scheme],
            _segments(url.path),
        )

    def admits(self, url: SplitResult) -> bool:
        scheme = url.scheme.lower()
        return (
            scheme == self.scheme
            and (url.hostname or "").lower() == self.host
            and (url.port or _PORTS.get(scheme)) == self.port
            and _segments(url.path)[: len(self.path)] == self.path
        )

    def __str__(self) -> str:
        port = "" if self.port == _PORTS[self.scheme] else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}/{'/'.join(self.path)}"


def check_subject(subject: str, allow: tuple[str, ...]) -> None:
    """Refuse a NATS subject of the server's own APIs, or one outside ``allow``."""
    if subject.startswith(("$", "_INBOX.")):
        raise ValueError(
            "subject: $-prefixed and _INBOX subjects are the server's own "
            "(JetStream API, KV, system); publish to a stream's subject"
        )
    tokens = subject.split(".")
    if any(not t for t in tokens):
        raise ValueError("subject: has an empty token")
    for prefix in allow:
        wanted = prefix.split(".")
        if tokens[: len(wanted)] == wanted:
            return
    if allow:
        raise ValueError(f"subject {subject} is not under OUTBOX_NATS_ALLOW ({', '.join(allow)})")


def check_name(what: str, name: str, allow: tuple[str, ...], variable: str) -> None:
    """Refuse ``name`` (a stream, an exchange) unless ``allow`` is empty or admits it:
    an entry equal to it, or one ending in * that it starts with."""
    if not allow:
        return
    for entry in allow:
        if entry == name or (entry.endswith("*") and name.startswith(entry[:-1])):
            return
    raise ValueError(f"{what} {name or '(default)'} is not in {variable} ({', '.join(allow)})")
