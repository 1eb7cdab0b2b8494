"""A real SMTP server for the tests: aiosmtpd on a loopback port, in a thread."""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

USER, PASSWORD = "relay", "smtp-pa55word"


def body(mail: EmailMessage, subtype: str = "plain") -> str:
    """The ``text/<subtype>`` part of ``mail``, decoded."""
    part = mail.get_body((subtype,))
    assert part is not None, f"no text/{subtype} part"
    return str(part.get_content())


class Inbox:
    """Records what the server accepted.

    ``refuse`` makes it answer RCPT for an address with a reply; ``sender`` and
    ``data``, when set, are its answer to every MAIL FROM and DATA.
    """

    def __init__(self) -> None:
        self.mails: list[EmailMessage] = []
        self.logins: list[bytes | None] = []
        self.refuse: dict[str, list[str]] = {}
        self.sender: str | None = None
        self.data: str | None = None

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.sender:
            return self.sender
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        replies = self.refuse.get(address)
        if replies:
            return replies.pop(0)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data:
            return self.data
        raw = envelope.original_content or b""
        mail = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(mail, EmailMessage)
        self.mails.append(mail)
        self.logins.append(session.auth_data)
        return "250 OK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _authenticate(
    server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
) -> AuthResult:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
        USER.encode(),
        PASSWORD.encode(),
    )
    if not ok:
        return AuthResult(success=False, handled=False)  # the server answers 535
    return AuthResult(success=True, auth_data=data.login)


@contextmanager
def smtp_server(
    port: int | None = None, *, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[Inbox, int]]:
    """Run an SMTP server; with ``tls``, it requires STARTTLS and AUTH."""
    inbox = Inbox()
    port = port or free_port()
    options: dict[str, Any] = {}
    if tls is not None:
        options = {
            "tls_context": tls,
            "require_starttls": True,
            "auth_required": True,
            "authenticator": _authenticate,
        }
    controller = Controller(inbox, hostname="127.0.0.1", port=port, **options)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
