"""The built-in mail topics: sign-in links and email changes, their payloads and SMTP handlers.

``topics`` (the names and payload models) is light; the SMTP handlers load
aiosmtplib (the ``mail`` extra) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox.handlers.mail.topics import EMAIL_CHANGE, LOGIN_LINK, TOPICS, EmailChange, LoginLink

if TYPE_CHECKING:
    from outbox.handlers.mail.smtp import SmtpSender, mail_handlers

__all__ = [
    "EMAIL_CHANGE",
    "LOGIN_LINK",
    "TOPICS",
    "EmailChange",
    "LoginLink",
    "SmtpSender",
    "mail_handlers",
]


def __getattr__(name: str) -> Any:
    if name in ("SmtpSender", "mail_handlers"):
        from outbox.handlers.mail import smtp

        return getattr(smtp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
