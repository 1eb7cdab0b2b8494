"""Mail handlers: turn mail.* messages into emails and send them over SMTP.

Delivery is at least once, so a message can be sent twice (a relay that
crashed after sending, before acking). Every email's Message-ID is built from
the outbox message id, so a resend is recognisably the same email. A link that
expired before its email went out is dropped, not sent. The payload holds
one-time codes: it is never logged, and errors never quote it.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import html
import logging
import ssl
import time
from collections.abc import Callable
from email.message import EmailMessage
from typing import TypeVar

import aiosmtplib
from prometheus_client import Gauge
from pydantic import BaseModel, ValidationError

from outbox.clock import Clock, system_clock
from outbox.errors import Dropped, Permanent, Unavailable, first_line
from outbox.handler import Handler
from outbox.handlers.mail.topics import EMAIL_CHANGE, LOGIN_LINK, EmailChange, LoginLink
from outbox.handlers.settings import SmtpSettings
from outbox.message import Message

__all__ = ["SmtpSender", "compose_email_change", "compose_login_link", "mail_handlers"]

P = TypeVar("P", bound=BaseModel)


_UP = Gauge(
    "outbox_smtp_up",
    "1 while this relay's last talk with the SMTP server got past connect, TLS, login and "
    "sender; 0 while the server or the relay's settings are at fault.",
)
_LONGEST_WAIT = 300.0

log = logging.getLogger("outbox.handlers.mail")

# The server or the relay's own settings are at fault, not the message: every
# message would fail the same way, so none is buried for it.
_RELAY_SIDE = (
    aiosmtplib.SMTPConnectError,  # refused, unreachable, 421/554 on connect
    aiosmtplib.SMTPHeloError,
    aiosmtplib.SMTPAuthenticationError,  # 535: a wrong password
    aiosmtplib.SMTPSenderRefused,  # MAIL FROM refused: the sender address
    aiosmtplib.SMTPNotSupported,  # no STARTTLS or AUTH where the settings want it
    aiosmtplib.SMTPServerDisconnected,
    aiosmtplib.SMTPTimeoutError,
    ssl.SSLError,
    OSError,
)


class SmtpSender:
    """Sends one email per connection, sorting failures by who is at fault.

    Only a 5xx about the message itself (every recipient refused, the content
    rejected) is Permanent. A failure of the server or of the relay's settings
    (connect, TLS, login, the sender address) raises Unavailable: retried
    after a growing delay without counting the attempt, logged once, with
    ``up`` (and ``outbox_smtp_up``) 0 until a send gets through again. Any
    other failure (4xx) is an ordinary retry.
    """

    def __init__(
        self, settings: SmtpSettings, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        if not settings.host:
            raise ValueError("outbox: SMTP is not configured (OUTBOX_SMTP_HOST)")
        self.settings = settings
        self.host = settings.host
        self.up = True
        self._monotonic = monotonic
        self._down_since = 0.0
        self._failures = 0
        self._tls_context: ssl.SSLContext | None = None
        if settings.tls != "none":
            self._tls_context = ssl.create_default_context(
                cafile=str(settings.ca_file) if settings.ca_file else None
            )
        _UP.set(1)

    async def send(self, mail: EmailMessage) -> None:
        s = self.settings
        try:
            await aiosmtplib.send(
                mail,
                # One recipient, named here: never derived from the headers.
                recipients=[str(mail["To"])],
                hostname=self.host,
                port=s.effective_port(),
                username=s.username,
                password=s.password.get_secret_value() if s.password else None,
                use_tls=s.tls == "tls",
                start_tls=s.tls == "starttls",
                tls_context=self._tls_context,
                timeout=s.timeout.total_seconds(),
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            self._reached()
            replies = "; ".join(f"{r.code} {r.message}" for r in exc.recipients)
            if all(r.code >= 500 for r in exc.recipients):
                raise Permanent(f"smtp: recipients refused: {replies}") from exc
            raise aiosmtplib.SMTPException(f"recipients refused: {replies}") from exc
        except aiosmtplib.SMTPDataError as exc:
            self._reached()
            if exc.code >= 500:
                raise Permanent(f"smtp: content refused: {exc.code} {exc.message}") from exc
            raise
        except _RELAY_SIDE as exc:
            raise self._unavailable(exc) from exc
        except aiosmtplib.SMTPResponseException as exc:
            if exc.code >= 500:
                raise self._unavailable(exc) from exc
            raise
        self._reached()

    def _reached(self) -> None:
        """The server took the connection, our login and our sender."""
        if not self.up:
            log.info("smtp server %s reachable again after %d failures", self.host, self._failures)
        self.up, self._failures = True, 0
        _UP.set(1)

    def _unavailable(self, exc: BaseException) -> Unavailable:
        """Wait as long again as the server has been down (1 s to 5 min).

        Measured from the first failure, not counted per failure, so a burst
        of messages failing together does not jump straight to the longest wait.
        """
        reason = _describe(exc)
        self._failures += 1
        if self.up:
            log.warning(
                "smtp server %s is unavailable or refuses this relay's settings: %s; "
                "messages wait (not buried) and are retried",
                self.host,
                reason,
            )
            self._down_since = self._monotonic()
        self.up = False
        _UP.set(0)
        wait = min(max(self._monotonic() - self._down_since, 1.0), _LONGEST_WAIT)
        return Unavailable(dt.timedelta(seconds=round(wait, 3)), f"smtp: {reason}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        return f"{exc.code} {exc.message}"
    return first_line(exc)


def _email(
    m: Message,
    *,
    to: str,
    subject: str,
    text: str,
    html_body: str,
    settings: SmtpSettings,
    clock: Clock,
) -> EmailMessage:
    """An email with plain-text and HTML parts and a Message-ID from the message id.

    CR or LF in a header value is refused: that is how header injection starts.
    """
    for name, value in (("to", to), ("subject", subject)):
        if "\r" in value or "\n" in value:
            raise Permanent(f"refusing to send: CR/LF in the {name} header (header injection)")
    mail = EmailMessage()
    mail["From"] = settings.from_address
    mail["To"] = to
    mail["Subject"] = subject
    mail["Date"] = email.utils.format_datetime(clock())
    mail["Message-ID"] = f"<{m.id}@{settings.domain()}>"
    mail["Outbox-Topic"] = m.topic
    mail.set_content(text)
    mail.add_alternative(html_body, subtype="html")
    return mail


def _when(p: LoginLink | EmailChange) -> str:
    return p.expires_at.strftime("%Y-%m-%d %H:%M %Z")


def compose_login_link(
    m: Message, p: LoginLink, settings: SmtpSettings, clock: Clock
) -> EmailMessage:
    """The sign-in email: link and code, as plain text and HTML."""
    return _email(
        m,
        to=p.to,
        subject="Your sign-in link",
        text=(
            f"Hello,\n\nSign in with this link:\n\n  {p.link}\n\n"
            f"or enter this code: {p.code}\n\nBoth work once, until {_when(p)}.\n"
            "If you did not ask to sign in, ignore this email.\n"
        ),
        html_body=(
            "<p>Hello,</p>"
            f'<p><a href="{html.escape(p.link)}">Sign in</a> or enter this code: '
            f"<strong>{html.escape(p.code)}</strong></p>"
            f"<p>Both work once, until {html.escape(_when(p))}.</p>"
            "<p>If you did not ask to sign in, ignore this email.</p>"
        ),
        settings=settings,
        clock=clock,
    )


def compose_email_change(
    m: Message, p: EmailChange, settings: SmtpSettings, clock: Clock
) -> EmailMessage:
    """The confirmation email to the new address, as plain text and HTML."""
    return _email(
        m,
        to=p.to,
        subject="Confirm your new email address",
        text=(
            f"Hello,\n\nYou asked to change your account's email from {p.previous} to this "
            f"address. Confirm it with this link:\n\n  {p.link}\n\n"
            f"It works once, until {_when(p)}.\nIf you did not ask for this, ignore this email.\n"
        ),
        html_body=(
            f"<p>Hello,</p><p>You asked to change your account's email from "
            f"{html.escape(p.previous)} to this address.</p>"
            f'<p><a href="{html.escape(p.link)}">Confirm the new address</a></p>'
            f"<p>It works once, until {html.escape(_when(p))}.</p>"
            "<p>If you did not ask for this, ignore this email.</p>"
        ),
        settings=settings,
        clock=clock,
    )


def _payload(m: Message, model: type[P]) -> P:
    try:
        return model.model_validate_json(m.payload)
    except ValidationError as exc:
        # The error's own text would quote the payload (and its code).
        fields = ", ".join(".".join(map(str, e["loc"])) for e in exc.errors(include_input=False))
        raise Permanent(f"payload is not a valid {model.__name__} (fields: {fields})") from None


def mail_handlers(
    settings: SmtpSettings,
    *,
    clock: Clock = system_clock,
    sender: SmtpSender | None = None,
) -> dict[str, Handler]:
    """The handlers of the mail topics, sending through ``sender`` (or ``settings``' server)."""
    smtp = sender or SmtpSender(settings)

    async def login_link(m: Message) -> None:
        p = _payload(m, LoginLink)
        if p.expires_at <= clock():
            raise Dropped("expired")
        await smtp.send(compose_login_link(m, p, settings, clock))

    async def email_change(m: Message) -> None:
        p = _payload(m, EmailChange)
        if p.expires_at <= clock():
            raise Dropped("expired")
        await smtp.send(compose_email_change(m, p, settings, clock))

    return {LOGIN_LINK: login_link, EMAIL_CHANGE: email_change}
