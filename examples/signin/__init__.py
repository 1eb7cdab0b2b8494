"""The design's example application: accounts that sign in by emailed links and change email.

Each use case changes its own tables and adds its outbox message in one
transaction: the message exists exactly when the change does. The mail topics,
their payloads and SMTP handlers are the product's (``outbox.handlers.mail``);
the accounts, codes and use cases here are an application's, with tables of
its own (``create_schema``), never created by `outbox migrate`.
"""

from __future__ import annotations

from examples.signin.errors import EmailTaken, InvalidCode, InvalidToken, UnknownAccount
from examples.signin.schema import create_schema
from examples.signin.usecases import (
    confirm_email_change,
    redeem_login_code,
    request_email_change,
    request_login_link,
)

__all__ = [
    "EmailTaken",
    "InvalidCode",
    "InvalidToken",
    "UnknownAccount",
    "confirm_email_change",
    "create_schema",
    "redeem_login_code",
    "request_email_change",
    "request_login_link",
]
