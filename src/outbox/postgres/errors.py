"""psycopg's errors as the package's own, translated here and nowhere else.

The store translates what its own statements raise (not what an application
runs inside ``begin()``); ``outbox`` commands translate what escapes anything
else they ran (a migration, a start-up check), so no caller above this
package needs to know the driver.
"""

from __future__ import annotations

import psycopg

from outbox.errors import (
    NotPermitted,
    OutboxError,
    SchemaMissing,
    StoreError,
    StoreUnavailable,
    first_line,
)

__all__ = ["SCHEMA_MISSING", "translate", "translated"]

SCHEMA_MISSING = "the outbox schema is missing or out of date: run `outbox migrate`"


def translated(exc: BaseException) -> OutboxError | None:
    """The OutboxError that ``exc`` stands for (None: not a psycopg error)."""
    return translate(exc) if isinstance(exc, psycopg.Error) else None


def translate(exc: psycopg.Error) -> OutboxError:
    """The OutboxError that the psycopg error ``exc`` stands for.

    Its message is the server's first line at most, which never quotes a
    password; the driver's error stays its ``__cause__``.
    """
    line = first_line(exc, typed=False)
    found: OutboxError
    if isinstance(exc, psycopg.OperationalError):  # psycopg_pool.PoolTimeout is one too
        found = StoreUnavailable(f"outbox: database unavailable: {line}")
    elif isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
        found = SchemaMissing(SCHEMA_MISSING)
    elif isinstance(exc, psycopg.errors.InsufficientPrivilege):
        found = NotPermitted(f"database error: {line}")
    else:
        found = StoreError(f"database error: {line}")
    found.__cause__ = exc
    return found
