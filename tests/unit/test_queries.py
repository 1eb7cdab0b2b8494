"""The store's statements as loaded: what psycopg sends for each."""

from __future__ import annotations

from outbox.postgres.queries import QUERIES

# psycopg parses a statement longer than this anew on every execution
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH) instead of caching the parse.
PSYCOPG_CACHES_UP_TO = 4096


def test_every_statement_is_short_enough_for_psycopg_to_cache_its_parse() -> None:
    long = {name: len(q.encode()) for name, q in QUERIES.items()}
    assert {n: size for n, size in long.items() if size > PSYCOPG_CACHES_UP_TO} == {}


def test_comment_lines_are_not_sent_but_the_statement_is_whole() -> None:
    claim = QUERIES["message_claim"]
    assert "--" not in claim
    assert claim.startswith("WITH t AS MATERIALIZED")
    assert claim.rstrip().endswith("ORDER BY p.due_at, p.id;")
