"""The mail topics and their payloads. Nothing else spells the topic names."""

from __future__ import annotations

import uuid

from pydantic import AwareDatetime, BaseModel, ConfigDict

__all__ = ["EMAIL_CHANGE", "LOGIN_LINK", "TOPICS", "EmailChange", "LoginLink"]

LOGIN_LINK = "mail.login_link"
"""Someone asked for a sign-in link: email it with its one-time code."""

EMAIL_CHANGE = "mail.email_change"
"""A user asked to change their email: email a confirmation link to the new address."""

TOPICS = frozenset({LOGIN_LINK, EMAIL_CHANGE})
"""The topics with a built-in handler."""


class LoginLink(BaseModel):
    """Payload of mail.login_link. Holds the one-time code: never log it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    account_id: uuid.UUID
    to: str
    link: str
    code: str
    expires_at: AwareDatetime


class EmailChange(BaseModel):
    """Payload of mail.email_change, addressed to the new address."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    account_id: uuid.UUID
    to: str
    previous: str
    link: str
    expires_at: AwareDatetime
