"""Migrate adopts nothing: every outbox object is the migrating role's, and no trigger
it did not create sits on an outbox table, under a superuser as under an owner role.

A role with CREATE on the schema can make an outbox table before the release
that adds it, owned by itself and with a trigger that copies each row; a
superuser's migrate used to adopt it (a superuser is a member of every role).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from outbox.errors import MigrationRefused
from outbox.postgres import migrate
from outbox.postgres.queries import migrations

# What a role with CREATE on the schema can make first, one object of each kind.
SQUATS = {
    "table": ("outbox_backlog", "CREATE TABLE outbox_backlog (id boolean PRIMARY KEY)"),
    "sequence": ("outbox_messages_seq", "CREATE SEQUENCE outbox_messages_seq"),
    "function": (
        "outbox_copy",
        "CREATE FUNCTION outbox_copy() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
    ),
    "type": ("outbox_state", "CREATE TYPE outbox_state AS ENUM ('a')"),
    "view": ("outbox_relays", "CREATE VIEW outbox_relays AS SELECT 1 AS id"),
}

_COPY = """
CREATE TABLE {copies} (payload text);
CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO {copies} VALUES (NEW.payload); RETURN NEW; END $$;
CREATE TRIGGER {trigger} AFTER INSERT ON outbox_messages
  FOR EACH ROW EXECUTE FUNCTION {fn}();
"""


class Schema:
    """A fresh schema owned by a fresh login role (the owner), and a squatter role
    with CREATE on it; the test's server user is the superuser."""

    def __init__(self, admin: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.admin = admin
        self.name = f"t_own_{tag}"
        self.owner, self.squatter = f"t_owner_{tag}", f"t_squatter_{tag}"
        with psycopg.connect(admin, autocommit=True) as conn:
            for role in (self.owner, self.squatter):
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                    sql.Identifier(self.name), sql.Identifier(self.owner)
                )
            )
            conn.execute(
                sql.SQL("GRANT CREATE, USAGE ON SCHEMA {} TO {}").format(
                    sql.Identifier(self.name), sql.Identifier(self.squatter)
                )
            )

    def url(self, user: str | None = None) -> str:
        """Conninfo of ``user`` (None: the superuser) with the schema first in its path."""
        extra = {} if user is None else {"user": user}
        return make_conninfo(self.admin, **extra, options=f"-c search_path={self.name}")

    def run(self, statements: str, user: str | None = None) -> None:
        with psycopg.connect(self.url(user), autocommit=True) as conn:
            conn.execute(statements.encode())

    def objects(self) -> list[tuple[str, str, str]]:
        """Every object in the schema: (kind, name, owner); a trigger's is its table's."""
        query = """
        SELECT c.relkind::text, c.relname, pg_get_userbyid(c.relowner) FROM pg_class AS c
        WHERE c.relnamespace = %(s)s::regnamespace
        UNION ALL
        SELECT 'function', p.proname, pg_get_userbyid(p.proowner) FROM pg_proc AS p
        WHERE p.pronamespace = %(s)s::regnamespace
        UNION ALL
        SELECT 'type', t.typname, pg_get_userbyid(t.typowner) FROM pg_type AS t
        WHERE t.typnamespace = %(s)s::regnamespace AND t.typrelid = 0 AND t.typelem = 0
        UNION ALL
        SELECT 'trigger', t.tgname, pg_get_userbyid(c.relowner) FROM pg_trigger AS t
        JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE c.relnamespace = %(s)s::regnamespace AND NOT t.tgisinternal
        ORDER BY 2
        """
        with psycopg.connect(self.admin) as conn:
            return [tuple(r) for r in conn.execute(query, {"s": self.name}).fetchall()]

    def applied(self) -> int:
        with psycopg.connect(self.admin) as conn:
            query = sql.SQL("SELECT to_regclass({}) IS NOT NULL").format(
                sql.Literal(f"{self.name}.outbox_schema_migrations")
            )
            row = conn.execute(query).fetchone()
            if not row or not row[0]:
                return 0
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.outbox_schema_migrations").format(
                    sql.Identifier(self.name)
                )
            ).fetchone()
            return int(counted[0]) if counted else 0

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.name)))
            for role in (self.owner, self.squatter):
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def schema(postgres_url: str) -> Iterator[Schema]:
    s = Schema(postgres_url)
    yield s
    s.drop()


def _superuser(schema: Schema) -> bool:
    with psycopg.connect(schema.admin) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        return bool(row and row[0])


@pytest.mark.parametrize("migrator", ["superuser", "owner"])
async def test_every_object_the_migrations_make_is_the_migrating_roles_and_checked(
    schema: Schema, migrator: str
) -> None:
    assert _superuser(schema), "the tests' server user must be a superuser"
    user = None if migrator == "superuser" else schema.owner

    await migrate(schema.url(user))

    objects = schema.objects()
    assert objects, "migrate made nothing"
    role = schema.owner if user is not None else _current_user(schema)
    for kind, name, owner in objects:
        # Named as the check looks for them, of a kind it looks at, and ours.
        assert name.startswith("outbox_"), f"{kind} {name} escapes migrate's ownership check"
        assert kind in {"r", "p", "i", "I", "S", "function", "type"}, (
            f"{name}: kind {kind} unchecked"
        )
        assert owner == role, f"{kind} {name} is owned by {owner}, not {role}"
    assert not [o for o in objects if o[0] == "trigger"], "the product creates no trigger"
    assert schema.applied() == len(migrations())


def _current_user(schema: Schema) -> str:
    with psycopg.connect(schema.admin) as conn:
        row = conn.execute("SELECT current_user").fetchone()
        assert row is not None
        return str(row[0])


@pytest.mark.parametrize("kind", sorted(SQUATS))
@pytest.mark.parametrize("migrator", ["superuser", "owner"])
async def test_migrate_refuses_an_outbox_object_another_role_made_first(
    schema: Schema, kind: str, migrator: str
) -> None:
    name, statement = SQUATS[kind]
    schema.run(statement, user=schema.squatter)

    with pytest.raises(MigrationRefused) as refused:
        await migrate(schema.url(None if migrator == "superuser" else schema.owner))

    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"migration 0001_outbox_messages: {kind} {name} is owned by ")
    assert f"owned by {schema.squatter}, not by the migrating role" in said
    assert schema.applied() == 0, "nothing is applied while a foreign object is there"


async def test_a_squatted_table_with_a_copying_trigger_sees_no_message(schema: Schema) -> None:
    # The audit's attack, whole: the squatter's table and trigger, a superuser's migrate.
    schema.run(
        "CREATE TABLE outbox_messages (id uuid, payload text);"
        + _COPY.format(copies="stolen", fn="steal", trigger="steal"),
        user=schema.squatter,
    )

    with pytest.raises(MigrationRefused, match=r"table outbox_messages is owned by t_squatter"):
        await migrate(schema.url())

    assert schema.applied() == 0


@pytest.mark.parametrize("migrator", ["superuser", "owner"])
async def test_a_trigger_migrate_did_not_create_is_refused_until_allowed_by_name(
    schema: Schema, migrator: str
) -> None:
    user = None if migrator == "superuser" else schema.owner
    await migrate(schema.url(user))
    # A DBA's audit trigger, then an upgrade that brings one more migration.
    schema.run(_COPY.format(copies="audit_copies", fn="audit_copy", trigger="audit_copy"), user)
    last, name, _ = migrations()[-1]
    schema.run(f"DELETE FROM outbox_schema_migrations WHERE version = {last}", user)

    with pytest.raises(MigrationRefused) as refused:
        await migrate(schema.url(user))
    assert str(refused.value) == (
        f"migration {last:04d}_{name}: trigger audit_copy on outbox_messages was not created "
        "by outbox-relay and would see every message; drop it, or allow it by name "
        "(outbox migrate --allow-trigger audit_copy)"
    )
    assert schema.applied() == len(migrations()) - 1

    assert await migrate(schema.url(user), allow_triggers=["audit_copy"]) == [last]
    assert schema.applied() == len(migrations())
