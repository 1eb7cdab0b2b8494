"""What the user domain's use cases refuse."""

from __future__ import annotations

from outbox.errors import OutboxError

__all__ = ["EmailTaken", "InvalidCode", "InvalidToken", "UnknownAccount"]


class InvalidCode(OutboxError):
    """The sign-in code is wrong, used already or expired."""


class InvalidToken(OutboxError):
    """The confirmation link is wrong, used already or expired."""


class EmailTaken(OutboxError):
    """Another account has this email address."""


class UnknownAccount(OutboxError):
    """No account has this id."""
