"""Who may use the console: API tokens from a file (a mounted Secret), by role.

The file holds one ``NAME ROLE TOKEN`` a line (``#`` starts a comment). It is
read again when it changes, so a rotated Secret takes effect without a
restart. Tokens are compared in constant time and never logged; a caller is
known by its NAME.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import logging
import os
from pathlib import Path

from outbox.errors import ConfigError

__all__ = ["Identity", "Role", "TokenFile", "token_fingerprint"]

log = logging.getLogger("outbox.ui")

MIN_TOKEN = 16
"""The shortest token accepted: a guessable one is refused when read."""


class Role(enum.Enum):
    """What a caller may do."""

    VIEWER = "viewer"
    """Everything but payloads and changes."""
    OPERATOR = "operator"
    """Also reveals payloads, requeues, purges, pauses and resumes."""


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """A caller: its name (for the audit log) and role."""

    name: str
    role: Role

    @property
    def operates(self) -> bool:
        return self.role is Role.OPERATOR


ANONYMOUS = Identity("anonymous", Role.VIEWER)
"""Every visitor of a console without authentication (it listens on loopback only)."""


class TokenFile:
    """The tokens of ``path``, read again whenever its modification time or size
    changes. A malformed file is a ConfigError naming OUTBOX_UI_TOKENS_FILE at
    start; read again later, a malformed file keeps the last good tokens (and
    says so once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._tokens: list[tuple[bytes, Identity]] = []
        self._reload(first=True)

    def who(self, token: str) -> Identity | None:
        """The identity ``token`` stands for, or None."""
        self._reload(first=False)
        given = token.encode()
        found = None
        for known, identity in self._tokens:  # every entry compared: no early exit
            if hmac.compare_digest(given, known):
                found = identity
        return found

    def still(self, identity: Identity, fingerprint: str) -> Identity | None:
        """The identity a session signed in as, as the file has it now: None once
        its token is gone or changed (a rotated Secret ends its sessions)."""
        self._reload(first=False)
        found = None
        for known, current in self._tokens:
            if current.name == identity.name and hmac.compare_digest(
                fingerprint, token_fingerprint(known)
            ):
                found = current
        return found

    def _reload(self, *, first: bool) -> None:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if first:
                raise ConfigError("OUTBOX_UI_TOKENS_FILE", f"cannot read it: {exc}") from None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            tokens = _parse(self.path.read_text())
        except (OSError, ValueError) as exc:
            if first:
                raise ConfigError("OUTBOX_UI_TOKENS_FILE", str(exc)) from None
            log.warning("OUTBOX_UI_TOKENS_FILE: %s; the tokens read before stay", exc)
            self._stamp = stamp
            return
        self._tokens, self._stamp = tokens, stamp
        if not first:
            log.info("OUTBOX_UI_TOKENS_FILE read again: %d tokens", len(tokens))


def token_fingerprint(token: bytes) -> str:
    """What a session keeps of the token it signed in with: enough to tell the
    token changed, nothing to sign in with."""
    return hashlib.sha256(b"outbox-ui-session:" + token).hexdigest()[:32]


def _parse(text: str) -> list[tuple[bytes, Identity]]:
    tokens = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"line {n}: expected NAME ROLE TOKEN")
        name, role, token = parts
        try:
            chosen = Role(role.lower())
        except ValueError:
            raise ValueError(f"line {n}: role must be viewer or operator") from None
        if len(token) < MIN_TOKEN:
            raise ValueError(f"line {n}: a token needs at least {MIN_TOKEN} characters")
        tokens.append((token.encode(), Identity(name, chosen)))
    if not tokens:
        raise ValueError("no tokens in it")
    return tokens
