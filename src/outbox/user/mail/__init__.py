"""Mail topics: sign-in links and email changes, their use cases and SMTP handlers."""

from __future__ import annotations

from outbox.user.mail.handlers import SmtpSender, mail_handlers
from outbox.user.mail.topics import EMAIL_CHANGE, LOGIN_LINK, EmailChange, LoginLink
from outbox.user.mail.usecases import (
    confirm_email_change,
    redeem_login_code,
    request_email_change,
    request_login_link,
)

__all__ = [
    "EMAIL_CHANGE",
    "LOGIN_LINK",
    "EmailChange",
    "LoginLink",
    "SmtpSender",
    "confirm_email_change",
    "mail_handlers",
    "redeem_login_code",
    "request_email_change",
    "request_login_link",
]
