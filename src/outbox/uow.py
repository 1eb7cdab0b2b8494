"""The unit-of-work seam: the transaction a message is added in.

Every store offers ``begin()``, an async context manager that yields that
backend's transaction. Whatever the caller changes inside it and the messages
it adds commit together, or, when the block raises, roll back together: the
message exists exactly when the change does.

For PostgreSQL the transaction is a psycopg ``AsyncConnection``; the store's
``add`` also accepts a connection the application already holds inside its
own transaction.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

__all__ = ["UnitOfWork"]

Tx_co = TypeVar("Tx_co", covariant=True)


class UnitOfWork(Protocol[Tx_co]):
    """Something that opens transactions of type ``Tx_co``."""

    def begin(self) -> AbstractAsyncContextManager[Tx_co]:
        """Open a transaction; commit when the block ends, roll back if it raises."""
        ...
