"""The rules of docs/design/migrations.md, checked on every shipped migration (no database).

A migration runs while producers insert and old relays claim: a statement that
takes a strong lock for long, or rewrites the table, stalls every producer
behind it. What is allowed is listed in docs/design/migrations.md; this test fails
for a new migration that breaks a rule, naming the statement.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from outbox.postgres.queries import migrations
from outbox.postgres.schema import statements, transactional

DJANGO = Path(__file__).resolve().parents[2] / "src" / "outbox" / "django" / "migrations"

# Statements that hold ACCESS EXCLUSIVE (or SHARE) for as long as the table is
# read or rewritten, whatever lock_timeout says once the lock is granted.
FORBIDDEN = [
    (r"\bALTER\s+COLUMN\b.*\bTYPE\b", "changes a column's type (rewrites the table)"),
    (r"\bSET\s+NOT\s+NULL\b", "scans the table under ACCESS EXCLUSIVE"),
    (r"\bADD\s+(CONSTRAINT\b.*\b|COLUMN\b.*\b)?(CHECK|FOREIGN\s+KEY|REFERENCES)\b"
     r"(?!.*\bNOT\s+VALID\b)",
     "validates every row under the lock; add it NOT VALID, then VALIDATE CONSTRAINT"),
    (r"\bADD\s+(CONSTRAINT\s+\w+\s+)?(PRIMARY\s+KEY|UNIQUE)\b(?!\s+USING\s+INDEX)",
     "builds an index under the lock; build it CONCURRENTLY, then ADD ... USING INDEX"),
    (r"\bDEFAULT\s+(now|clock_timestamp|random|gen_random_uuid|uuid_generate)\w*\s*\(",
     "a volatile default rewrites the table"),
    (r"\bVACUUM\s+FULL\b|\bCLUSTER\b|\bLOCK\s+TABLE\b|\bREINDEX\b(?!.*\bCONCURRENTLY\b)",
     "holds ACCESS EXCLUSIVE for the whole rewrite"),
    (r"^(BEGIN|COMMIT|START\s+TRANSACTION)\b|\bSET\s+(LOCAL\s+)?lock_timeout\b",
     "the runner owns transactions and lock_timeout"),
]  # fmt: skip
_CREATED = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
# Validating a NOT VALID constraint reads the table under SHARE UPDATE
# EXCLUSIVE, which producers do not wait for: a statement of its own.
_VALIDATE = re.compile(r"\bVALIDATE\s+CONSTRAINT\b", re.I)
_INDEX = re.compile(
    r"(CREATE\s+(?:UNIQUE\s+)?INDEX|DROP\s+INDEX)\s+(CONCURRENTLY\s+)?"
    r"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(\w+)(?:\s+ON\s+(\w+))?",
    re.I,
)


def _one_line(statement: str) -> str:
    """``statement`` on one line; a name a DO block formats (``outbox_messages_%s``)
    reads as one name."""
    return " ".join(statement.split()).replace("%s", "N")


def violations(version: int, sql: str, existing: set[str]) -> list[str]:
    """What breaks the rules in migration ``version``, given the tables before it."""
    found = []
    created: set[str] = set()
    for statement in statements(sql):
        flat = _one_line(statement)
        created |= {t.lower() for t in _CREATED.findall(flat)}
        for pattern, why in FORBIDDEN:
            # The registry's tables are small: a scan under their lock is instant.
            large = "outbox_messages" in flat or why.startswith("the runner")
            if large and re.search(pattern, flat, re.I):
                found.append(f"{version:04d}: {flat[:80]}: {why}")
        for verb, concurrently, _, table in _INDEX.findall(flat):
            new = table and table.lower() in created and table.lower() not in existing
            if not concurrently and not new:
                found.append(
                    f"{version:04d}: {flat[:80]}: {verb.upper()} on a table producers write "
                    "must be CONCURRENTLY, in a migration marked '-- outbox: no transaction'"
                )
            if concurrently and transactional(sql):
                found.append(f"{version:04d}: CONCURRENTLY needs '-- outbox: no transaction'")
    if not transactional(sql) and any(
        not _INDEX.search(s) and not _VALIDATE.search(s) for s in statements(sql)
    ):
        found.append(
            f"{version:04d}: a no-transaction migration holds index builds and validations only"
        )
    return found


def test_every_shipped_migration_keeps_the_rules() -> None:
    existing: set[str] = set()
    found = []
    for version, _, sql in migrations():
        found += violations(version, sql, existing)
        existing |= {t.lower() for t in _CREATED.findall(_one_line(sql))}
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("CREATE INDEX IF NOT EXISTS outbox_messages_key_idx ON outbox_messages (key);",
         "must be CONCURRENTLY"),
        ("CREATE INDEX CONCURRENTLY x ON outbox_messages (key);", "needs '-- outbox: no tr"),
        ("ALTER TABLE outbox_messages ALTER COLUMN topic TYPE varchar(300);", "rewrites"),
        ("ALTER TABLE outbox_messages ALTER COLUMN key SET NOT NULL;", "scans the table"),
        ("ALTER TABLE outbox_messages ADD CONSTRAINT k CHECK (length(key) < 200);",
         "NOT VALID"),
        ("ALTER TABLE outbox_messages ADD COLUMN seen timestamptz DEFAULT now();", "volatile"),
        ("ALTER TABLE outbox_messages ADD COLUMN o text CHECK (o IN ('a', 'b'));", "NOT VALID"),
        ("LOCK TABLE outbox_messages;", "ACCESS EXCLUSIVE"),
        ("SET lock_timeout = '10s';", "the runner owns"),
        ("-- outbox: no transaction\nALTER TABLE outbox_messages ADD COLUMN k text;",
         "index builds and validations only"),
    ],
)  # fmt: skip
def test_a_migration_that_would_stall_producers_is_refused(sql: str, why: str) -> None:
    found = violations(99, sql, {"outbox_messages"})
    assert any(why in f for f in found), found


def test_what_the_rules_allow_passes() -> None:
    allowed = [
        "ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS key text;",
        "ALTER TABLE outbox_messages ADD COLUMN n integer NOT NULL DEFAULT 0;",
        "ALTER TABLE outbox_messages ADD CONSTRAINT k CHECK (length(key) <= 200) NOT VALID;",
        "CREATE TABLE IF NOT EXISTS outbox_keys (key text PRIMARY KEY);\n"
        "CREATE INDEX IF NOT EXISTS outbox_keys_idx ON outbox_keys (key);",
        "-- outbox: no transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_key_idx ON outbox_messages (key);",
    ]
    for sql in allowed:
        assert violations(99, sql, {"outbox_messages"}) == [], sql


def test_every_sql_migration_has_exactly_one_django_twin() -> None:
    covered: list[int] = []
    for path in sorted(DJANGO.glob("0*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "run_shipped":
                bounds = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                covered += [v for v, _, _ in migrations() if bounds["first"] <= v <= bounds["last"]]
    assert sorted(covered) == [v for v, _, _ in migrations()]


def test_django_runs_the_shipped_migrations_only_through_the_runner() -> None:
    """No Django migration runs SQL or schema operations of its own: only
    run_shipped, whose operations take lock_timeout and retry (and atomic =
    False, so each shipped migration is a transaction a retry rolls back)."""
    for path in sorted(DJANGO.glob("0*.py")):
        tree = ast.parse(path.read_text())
        [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
        assigned = {
            t.id: n.value
            for n in cls.body
            if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Name) and n.value is not None
        }
        ops = assigned["operations"]
        assert isinstance(ops, ast.Call), path.name
        assert getattr(ops.func, "id", "") == "run_shipped", path.name
        assert ast.literal_eval(assigned["atomic"]) is False, path.name
