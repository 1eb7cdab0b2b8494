"""Add messages from Django, inside ``transaction.atomic()``.

``outbox.django.add(*messages, using="default")`` inserts through Django's own
connection, so the message commits or rolls back with the ORM changes of the
same atomic block. Outside one (Django's autocommit) it raises
NotInTransaction and stores nothing. Adding ``"outbox.django"`` to
INSTALLED_APPS lets ``manage.py migrate`` create the outbox tables with the
same SQL as `outbox migrate`. Once the block commits (``on_commit``), relays
are woken for what it added. Needs the ``django`` extra.
"""

from __future__ import annotations

from outbox.errors import NotInTransaction
from outbox.message import Message
from outbox.postgres.producer import INSERT_FULL, checked, insert_params, named_to
from outbox.postgres.queries import QUERIES
from outbox.wake import CHANNEL, WAKES

__all__ = ["add"]

_SQL, _NAMES = named_to("format")
_SQL_FULL, _NAMES_FULL = named_to("format", INSERT_FULL)


def add(*msgs: Message, using: str = "default") -> None:
    """Insert ``msgs`` through Django's connection ``using``, in its atomic block."""
    from django.db import connections, transaction

    checked(msgs)
    connection = connections[using]
    if not connection.in_atomic_block:
        raise NotInTransaction(f"Django's connection {using!r}")
    if not msgs:
        return
    params = insert_params(msgs, text_ids=True)
    sql, names = (_SQL_FULL, _NAMES_FULL) if "keys" in params else (_SQL, _NAMES)
    with connection.cursor() as cursor:
        cursor.execute(sql, [params[name] for name in names])
    topics = {m.topic for m in msgs}
    transaction.on_commit(lambda: _wake(topics, using), using=using)


def _wake(topics: set[str], using: str) -> None:
    from django.db import connections

    def notify(payload: str) -> None:
        with connections[using].cursor() as cursor:  # autocommit again, after the block
            cursor.execute(QUERIES["wake_notify"], {"channel": CHANNEL, "payload": payload})

    WAKES.send(topics, notify)
