"""The mail topics and their payloads. Nothing else spells the topic names."""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, StringConstraints

__all__ = ["EMAIL_CHANGE", "LOGIN_LINK", "TOPICS", "EmailChange", "LoginLink"]

LOGIN_LINK = "mail.login_link"
"""Someone asked for a sign-in link: email it with its one-time code."""

EMAIL_CHANGE = "mail.email_change"
"""A user asked to change their email: email a confirmation link to the new address."""

TOPICS = frozenset({LOGIN_LINK, EMAIL_CHANGE})
"""The topics with a built-in handler."""


Address = Annotated[
    str,
    StringConstraints(max_length=254, pattern=r'^[^\s@,;:<>()\[\]"\\]+@[^\s@,;:<>()\[\]"\\]+$'),
]
"""Exactly one addr-spec (local@domain): no lists, no display names, no groups."""


class LoginLink(BaseModel):
    """Payload of mail.login_link. Holds the one-time code: never log it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    account_id: uuid.UUID
    to: Address
    link: str
    code: str
    expires_at: AwareDatetime


class EmailChange(BaseModel):
    """Payload of mail.email_change, addressed to the new address."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    account_id: uuid.UUID
    to: Address
    previous: str
    link: str
    expires_at: AwareDatetime
