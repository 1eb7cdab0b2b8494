"""Adding messages from an application's own transaction, with every driver and framework.

Each API is driven the way an application drives it, against real PostgreSQL:
the change and its message commit together, roll back together, and a
connection outside any transaction is refused with nothing stored.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from outbox import NotInTransaction, new_message
from outbox.postgres import add, add_sync, migrate, transaction, transaction_sync, wake_sync
from outbox.postgres.queries import migrations
from outbox.wake import WAKES
from tools.upgrade import writing

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def db(pg_conninfo: str) -> str:
    anyio.run(migrate, pg_conninfo)
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id uuid PRIMARY KEY, item text NOT NULL)")
    return pg_conninfo


class Heard:
    """What the outbox channel carried, as a relay LISTENing on it would hear it."""

    def __init__(self, db: str) -> None:
        self.conn = psycopg.connect(db, autocommit=True)
        self.conn.execute("LISTEN outbox_messages")
        WAKES.forget()  # each test's first commit notifies

    def __call__(self, expected: int) -> list[str]:
        """The next ``expected`` payloads (0: whatever arrives within a short wait)."""
        if expected == 0:
            return [n.payload for n in self.conn.notifies(timeout=0.3)]
        return [n.payload for n in self.conn.notifies(timeout=5, stop_after=expected)]


@pytest.fixture
def heard(db: str) -> Iterator[Heard]:
    listener = Heard(db)
    yield listener
    listener.conn.close()


def stored(db: str) -> tuple[set[uuid.UUID], set[str]]:
    """(orders, message topics) in the table now."""
    with psycopg.connect(db) as conn:
        orders = {r[0] for r in conn.execute("SELECT id FROM orders")}
        topics = {r[0] for r in conn.execute("SELECT topic FROM outbox_messages")}
    return orders, topics


def order_message(order: uuid.UUID, n: int = 1) -> list[Any]:
    return [new_message("orders.placed", {"order": str(order), "n": i}) for i in range(n)]


# -- psycopg -----------------------------------------------------------------------------


async def test_psycopg_async_commits_and_rolls_back_with_the_change(db: str, heard: Heard) -> None:
    kept, lost = uuid.uuid4(), uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(db) as conn:
        with pytest.raises(RuntimeError):
            async with transaction(conn):
                await conn.execute("INSERT INTO orders VALUES (%s, 'cake')", (lost,))
                await add(conn, *order_message(lost))
                raise RuntimeError("the use case failed after adding")
        assert heard(0) == []  # a rolled-back transaction tells no relay
        async with transaction(conn):
            await conn.execute("INSERT INTO orders VALUES (%s, 'tea')", (kept,))
            await add(conn, *order_message(kept, 3))
        assert heard(1) == ["orders.placed"]  # once, after the commit, for three messages
        assert heard(0) == []
        # The notification went in autocommit; the connection is as it was.
        assert conn.autocommit is False
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    orders, _ = stored(db)
    assert orders == {kept}
    with psycopg.connect(db) as c:
        payloads = [r[0] for r in c.execute("SELECT payload->>'order' FROM outbox_messages")]
    assert payloads == [str(kept)] * 3


async def test_psycopg_async_outside_a_transaction_is_refused(db: str) -> None:
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        with pytest.raises(NotInTransaction, match="not inside a transaction"):
            await add(conn, *order_message(uuid.uuid4()))

    assert stored(db) == (set(), set())


def test_psycopg_sync_commits_rolls_back_and_refuses_autocommit(db: str, heard: Heard) -> None:
    kept, lost = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(db) as conn:  # not autocommit: the application commits
        conn.execute("INSERT INTO orders VALUES (%s, 'tea')", (kept,))
        add_sync(conn, *order_message(kept, 2))
        assert wake_sync(conn) is False  # inside the transaction: nothing rides in it
        conn.commit()
        assert wake_sync(conn) is True
        assert heard(1) == ["orders.placed"]
        assert conn.autocommit is False
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with pytest.raises(RuntimeError), transaction_sync(conn):
            conn.execute("INSERT INTO orders VALUES (%s, 'cake')", (lost,))
            add_sync(conn, *order_message(lost))
            raise RuntimeError("the use case failed")
        assert heard(0) == []
    with psycopg.connect(db, autocommit=True) as conn, pytest.raises(NotInTransaction):
        add_sync(conn, *order_message(uuid.uuid4()))

    assert stored(db) == ({kept}, {"orders.placed"})
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM outbox_messages").fetchone() == (2,)


def test_the_producer_reads_the_transaction_state_psycopg_reports(db: str) -> None:
    from psycopg.pq import TransactionStatus

    from outbox.postgres.producer import _idle

    with psycopg.connect(db) as conn:
        states = [(_idle(conn), conn.info.transaction_status)]
        conn.execute("SELECT 1")
        states.append((_idle(conn), conn.info.transaction_status))
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        states.append((_idle(conn), conn.info.transaction_status))
        conn.rollback()
        states.append((_idle(conn), conn.info.transaction_status))
    assert states == [
        (True, TransactionStatus.IDLE),
        (False, TransactionStatus.INTRANS),
        (False, TransactionStatus.INERROR),
        (True, TransactionStatus.IDLE),
    ]


# -- SQLAlchemy ------------------------------------------------------------------------


def _sa_url(db: str, driver: str) -> tuple[str, dict[str, Any]]:
    """A SQLAlchemy URL for ``db`` with ``driver``, and connect_args for its search_path."""
    from sqlalchemy.engine import URL

    parts = {k: str(v) for k, v in conninfo_to_dict(db).items() if v is not None}
    host = parts.get("host")
    # A socket directory (the embedded server's) goes in the query: as the
    # URL's host, SQLAlchemy would read the path as the database name.
    socket_dir = host if host and host.startswith("/") else None
    url = URL.create(
        f"postgresql+{driver}",
        username=parts.get("user"),
        host=None if socket_dir else host,
        port=int(parts["port"]) if parts.get("port") and not socket_dir else None,
        database=parts.get("dbname"),
        query={"host": socket_dir, **({"port": parts["port"]} if parts.get("port") else {})}
        if socket_dir
        else {},
    )
    options = parts.get("options") or ""
    schema = options.split("search_path=")[1].split()[0] if "search_path=" in options else None
    if driver == "asyncpg":
        return url.render_as_string(), {"server_settings": {"search_path": schema or "public"}}
    return url.render_as_string(), {"options": f"-c search_path={schema}"} if schema else {}


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_sqlalchemy_session_and_connection(db: str, driver: str, heard: Heard) -> None:
    from sqlalchemy import QueuePool, create_engine, text
    from sqlalchemy.orm import Session

    from outbox.sqlalchemy import add as sa_add

    url, args = _sa_url(db, driver)
    engine = create_engine(url, connect_args=args)
    kept, lost, via_conn = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    try:
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO orders VALUES (:id, 'cake')"), {"id": lost})
            sa_add(session, *order_message(lost))
            raise RuntimeError("the use case failed")
        assert heard(0) == []
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO orders VALUES (:id, 'tea')"), {"id": kept})
            sa_add(session, *order_message(kept, 2))
        assert heard(1) == ["orders.placed"]  # after the commit; not for the rollback
        # The wake-up's connection went back to the pool as it was, out of autocommit.
        pool = engine.pool
        assert isinstance(pool, QueuePool)
        pooled = [engine.raw_connection() for _ in range(pool.checkedin())]
        assert len(pooled) == 2
        assert [getattr(p.driver_connection, "autocommit", None) for p in pooled] == [False] * 2
        for p in pooled:
            p.close()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO orders VALUES (:id, 'jam')"), {"id": via_conn})
            sa_add(conn, *order_message(via_conn))
        with Session(engine) as session, pytest.raises(NotInTransaction):
            sa_add(session, *order_message(uuid.uuid4()))
        auto = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with auto, pytest.raises(NotInTransaction):
            auto.execute(text("SELECT 1"))
            sa_add(auto, *order_message(uuid.uuid4()))
    finally:
        engine.dispose()

    assert stored(db)[0] == {kept, via_conn}
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM outbox_messages").fetchone() == (3,)


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
async def test_sqlalchemy_async_session(db: str, driver: str, heard: Heard) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from outbox.sqlalchemy import add_async

    url, args = _sa_url(db, driver)
    engine = create_async_engine(url, connect_args=args)
    kept, lost = uuid.uuid4(), uuid.uuid4()
    try:
        with pytest.raises(RuntimeError):
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text("INSERT INTO orders VALUES (:id, 'cake')"), {"id": lost})
                await add_async(session, *order_message(lost))
                raise RuntimeError("the use case failed")
        assert heard(0) == []
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(text("INSERT INTO orders VALUES (:id, 'tea')"), {"id": kept})
            await add_async(session, *order_message(kept, 3))
        assert heard(1) == ["orders.placed"]  # after the commit; not for the rollback
        async with AsyncSession(engine) as session:
            with pytest.raises(NotInTransaction):
                await add_async(session, *order_message(uuid.uuid4()))
        async with engine.connect() as auto:
            auto = await auto.execution_options(isolation_level="AUTOCOMMIT")
            await auto.execute(text("SELECT 1"))
            with pytest.raises(NotInTransaction):
                await add_async(auto, *order_message(uuid.uuid4()))
    finally:
        await engine.dispose()

    assert stored(db)[0] == {kept}
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM outbox_messages").fetchone() == (3,)


# -- Django -----------------------------------------------------------------------------


@pytest.fixture
def django_db(db: str) -> Iterator[Callable[[], Any]]:
    """Django configured against ``db`` (no project, no server); its connection per test."""
    import django
    from django.conf import settings
    from django.db import connections

    parts = conninfo_to_dict(db)
    options = parts.get("options") or ""
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.get("dbname"),
        "USER": parts.get("user") or "",
        "PASSWORD": parts.get("password") or "",
        "HOST": parts.get("host") or "",
        "PORT": parts.get("port") or "",
        "OPTIONS": {"options": options} if options else {},
    }
    if not settings.configured:
        settings.configure(
            DATABASES={"default": database},
            INSTALLED_APPS=["outbox.django"],
            USE_TZ=True,
        )
        django.setup()
    else:
        connections["default"].close()
        settings.DATABASES["default"].update(database)
        connections["default"].settings_dict.update(database)
    yield lambda: connections["default"]
    connections["default"].close()


def test_django_add_inside_atomic_only(django_db: Callable[[], Any], db: str, heard: Heard) -> None:
    from django.db import transaction

    from outbox.django import add as django_add

    kept, lost = uuid.uuid4(), uuid.uuid4()
    connection = django_db()
    with pytest.raises(RuntimeError), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES (%s, 'cake')", [str(lost)])
        django_add(*order_message(lost))
        raise RuntimeError("the view failed")
    assert heard(0) == []
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES (%s, 'tea')", [str(kept)])
        django_add(*order_message(kept, 2))
        assert heard(0) == []  # not before the commit
    assert heard(1) == ["orders.placed"]
    with pytest.raises(NotInTransaction, match="Django's connection 'default'"):
        django_add(*order_message(uuid.uuid4()))

    assert stored(db)[0] == {kept}
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM outbox_messages").fetchone() == (2,)


def test_django_migrate_creates_the_same_schema(
    django_db: Callable[[], Any], pg_conninfo: str
) -> None:
    from django.core.management import call_command

    from tests.integration.test_schema import schema_of

    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        migrated = schema_of(conn)
        conn.execute(
            "DROP TABLE outbox_messages, outbox_topics, outbox_relays, outbox_unserved,"
            " outbox_backlog, outbox_schema_migrations, orders"
        )
    call_command("migrate", "outbox", verbosity=0)

    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        by_django = {k: v for k, v in schema_of(conn).items() if "django_migrations" not in k}
    assert by_django == {k: v for k, v in migrated.items() if "orders" not in k}


def test_django_migrate_waits_in_short_steps_and_never_stalls_producers(
    django_db: Callable[[], Any], pg_conninfo: str, caplog: pytest.LogCaptureFixture
) -> None:
    """manage.py migrate runs the shipped migrations as `outbox migrate` does:
    under lock_timeout, retried, index builds CONCURRENTLY beside producers."""
    from django.core.management import call_command

    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE outbox_messages, outbox_topics, outbox_relays, outbox_unserved,"
            " outbox_backlog, outbox_schema_migrations"
        )
    call_command("migrate", "outbox", "0001", verbosity=0)  # the release before the indexes
    caplog.set_level(logging.WARNING, logger="outbox")
    with writing(pg_conninfo, producers=1, hold=2, until_refused=True) as waits:
        call_command("migrate", "outbox", verbosity=0)

    assert "trying again" in caplog.text
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        done = conn.execute("SELECT count(*) FROM outbox_schema_migrations").fetchone()
    assert done == (len(migrations()),)
    assert max(waits) < 1.0, f"a producer waited {max(waits):.2f}s behind manage.py migrate"


class Counting(psycopg.Connection[Any]):
    """A real connection that counts the statements it sends."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        type(self).sent += 1
        return super().execute(*args, **kwargs)


def test_many_messages_are_one_statement(db: str) -> None:
    with Counting.connect(db) as conn, conn.transaction():
        Counting.sent = 0
        add_sync(conn, *order_message(uuid.uuid4(), 200))

        assert Counting.sent == 1
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM outbox_messages").fetchone() == (200,)


def test_every_producer_path_refuses_a_payload_over_the_limit(
    db: str, max_payload: Callable[[str], None], django_db: Callable[[], Any]
) -> None:
    from django.db import transaction as django_transaction
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from outbox.django import add as django_add
    from outbox.sqlalchemy import add as sa_add

    big = new_message("files.uploaded", {"blob": "x" * 100_000})
    max_payload("64KiB")

    async def add_async() -> None:
        async with await psycopg.AsyncConnection.connect(db) as conn:
            with pytest.raises(ValueError, match="OUTBOX_MAX_PAYLOAD allows 65536"):
                await add(conn, big)

    anyio.run(add_async)
    with psycopg.connect(db) as sync, pytest.raises(ValueError, match="OUTBOX_MAX_PAYLOAD"):
        add_sync(sync, big)
    url, args = _sa_url(db, "psycopg")
    engine = create_engine(url, connect_args=args)
    with Session(engine) as session, pytest.raises(ValueError, match="OUTBOX_MAX_PAYLOAD"):
        sa_add(session, big)
    engine.dispose()
    django_db()
    with django_transaction.atomic(), pytest.raises(ValueError, match="OUTBOX_MAX_PAYLOAD"):
        django_add(big)

    assert stored(db) == (set(), set())


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_every_producer_path_stores_keys_in_the_order_given_and_headers(
    db: str, django_db: Callable[[], Any], driver: str
) -> None:
    from django.db import transaction as django_transaction
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    from outbox.django import add as django_add
    from outbox.sqlalchemy import add as sa_add
    from outbox.sqlalchemy import add_async as sa_add_async

    def two(path: str) -> list[Any]:  # a keyed message, an unkeyed one, then keyed again
        return [
            new_message("orders.events", {"via": path, "n": 0}, key="order-7"),
            new_message("orders.events", {"via": path, "n": 1}, headers={"X-Via": path}),
            new_message("orders.events", {"via": path, "n": 2}, key="order-7"),
        ]

    async def psycopg_async() -> None:
        async with await psycopg.AsyncConnection.connect(db) as conn, conn.transaction():
            await add(conn, *two("async"))
            await add(conn, new_message("orders.events", {"via": "async", "n": 3}, key="k"))

    anyio.run(psycopg_async)
    with psycopg.connect(db) as sync, sync.transaction():
        add_sync(sync, *two("sync"))
    url, args = _sa_url(db, driver)
    engine = create_engine(url, connect_args=args)
    with Session(engine) as session, session.begin():
        sa_add(session, *two("sqlalchemy"))
    engine.dispose()

    async def sqlalchemy_async() -> None:
        aurl, aargs = _sa_url(db, "psycopg")
        aengine = create_async_engine(aurl, connect_args=aargs)
        async with AsyncSession(aengine) as session, session.begin():
            await sa_add_async(session, *two("sqlalchemy-async"))
        await aengine.dispose()

    anyio.run(sqlalchemy_async)
    django_db()
    with django_transaction.atomic():
        django_add(*two("django"))

    with psycopg.connect(db) as c:
        rows = c.execute(
            "SELECT payload->>'via', (payload->>'n')::int, key, seq, headers FROM outbox_messages"
            " ORDER BY payload->>'via', (payload->>'n')::int"
        ).fetchall()
    by_path: dict[str, list[Any]] = {}
    for via, n, key, seq, headers in rows:
        by_path.setdefault(via, []).append((n, key, seq))
        assert headers == ({"x-via": via} if n == 1 else None), via
    assert set(by_path) == {"async", "sync", "sqlalchemy", "sqlalchemy-async", "django"}
    for via, got in by_path.items():
        keyed = [(n, seq) for n, key, seq in got if key == "order-7"]
        assert [n for n, _ in keyed] == [0, 2], via
        assert keyed[0][1] < keyed[1][1], f"{via}: the order given"
        assert [(n, key, seq) for n, key, seq in got if n == 1] == [(1, None, None)], via
    assert by_path["async"][-1][1] == "k"  # a single keyed message


def test_django_migrate_refuses_a_trigger_it_did_not_create_until_the_setting_names_it(
    django_db: Callable[[], Any], pg_conninfo: str
) -> None:
    from django.conf import settings
    from django.core.management import call_command

    from outbox.errors import MigrationRefused
    from outbox.postgres.queries import migrations

    call_command("migrate", "outbox", verbosity=0)
    last = migrations()[-1][0]
    with psycopg.connect(pg_conninfo, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION audit_copy() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RETURN NEW; END $$;"
            " CREATE TRIGGER audit_copy AFTER INSERT ON outbox_messages"
            " FOR EACH ROW EXECUTE FUNCTION audit_copy()"
        )
        # The release before the last migration, then the upgrade.
        conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s", [last])
        conn.execute(
            "DELETE FROM django_migrations WHERE app = 'outbox' AND name = ("
            " SELECT max(name) FROM django_migrations WHERE app = 'outbox')"
        )

    with pytest.raises(MigrationRefused, match="trigger audit_copy on outbox_messages"):
        call_command("migrate", "outbox", verbosity=0)

    settings.OUTBOX_ALLOW_TRIGGERS = ["audit_copy"]
    try:
        call_command("migrate", "outbox", verbosity=0)
    finally:
        del settings.OUTBOX_ALLOW_TRIGGERS
    assert count_versions(pg_conninfo) == len(migrations())


def count_versions(conninfo: str) -> int:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_schema_migrations").fetchone()
        return int(row[0]) if row else 0
