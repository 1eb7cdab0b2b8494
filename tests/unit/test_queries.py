"""The store's statements as loaded: what psycopg sends for each."""

from __future__ import annotations

import datetime as dt

import pytest

from outbox.postgres.claims import FIRST, FORMS, claim_params, claim_statement, without
from outbox.postgres.queries import QUERIES
from outbox.requests import ClaimRequest

LEASE = dt.timedelta(seconds=30)

# psycopg parses a statement longer than this anew on every execution
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH) instead of caching the parse.
PSYCOPG_CACHES_UP_TO = 4096


def test_every_statement_is_short_enough_for_psycopg_to_cache_its_parse() -> None:
    # message_claim is never run whole: each claim runs one of its forms.
    sent = {name: q for name, q in QUERIES.items() if name != "message_claim"}
    sent |= {f"message_claim{form}": q for form, q in FORMS.items()}
    sent |= {f"message_claim{form} from the first": q for form, q in FIRST.items()}
    long = {name: len(q.encode()) for name, q in sent.items()}
    assert {n: size for n, size in long.items() if size > PSYCOPG_CACHES_UP_TO} == {}


def test_comment_lines_are_not_sent_but_the_statement_is_whole() -> None:
    claim = QUERIES["message_claim"]
    assert "--" not in claim
    assert claim.startswith("WITH t AS MATERIALIZED")
    assert claim.rstrip().endswith("ORDER BY 11, 1;")


def test_each_form_of_the_claim_leaves_out_only_the_reads_its_request_leaves_empty() -> None:
    by_topic = claim_params(ClaimRequest(limit=1, lease=LEASE, topics=["a"]), None)
    every = claim_params(ClaimRequest(limit=1, lease=LEASE), None)
    capped = claim_params(ClaimRequest(limit=1, lease=LEASE, topics=["a"], caps={"b": 1}), None)

    every_capped = claim_params(ClaimRequest(limit=1, lease=LEASE, caps={"b": 1}), None)
    for params, gone, kept in (
        (by_topic, ("ready AS", "capped AS"), "ready_by_topic AS"),
        (every, ("ready_by_topic AS", "capped AS"), "ready AS"),
        (capped, ("ready AS",), "ready_by_topic AS"),
        (every_capped, ("ready_by_topic AS",), "ready AS"),
    ):
        form = claim_statement(params)
        assert kept in form
        assert not [g for g in gone if g in form]
        assert "orphans AS" in form


def test_a_read_the_claim_uses_elsewhere_is_never_left_out() -> None:
    with pytest.raises(ValueError, match="behind is read elsewhere"):
        without(QUERIES["message_claim"], "behind")
