"""A database URL that is wrong, however its password is written, is one line that
never quotes the password: not whole, not URL-encoded, not in pieces."""

from __future__ import annotations

import re
import urllib.parse

import pytest

from tests.integration.process import run_outbox, run_outbox_here

RELAY = {"OUTBOX_LOG_TOPICS": "orders.placed"}  # a relay that would start, but for the URL
PASSWORDS = ["Pa55 w0rdTail", "it's\"Quoted9", "p@ss@Word77", "100%Sure99", "mix @%' \"End42"]


def _forms(password: str) -> dict[str, str]:
    """The password in each way a user writes a DSN, right and wrong."""
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    return {
        "url": f"postgresql://app:{password}@127.0.0.1:1/db",
        "url-encoded": f"postgresql://app:{urllib.parse.quote(password, safe='')}@127.0.0.1:1/db",
        "keywords": f"host=127.0.0.1 port=1 user=app password={password} dbname=db",
        "keywords-quoted": f"host=127.0.0.1 port=1 user=app password='{quoted}' dbname=db",
    }


def _pieces(password: str) -> set[str]:
    """What must not appear: the password, encoded, and each run of 3+ letters or digits."""
    return {
        password,
        urllib.parse.quote(password, safe=""),
        *(run for run in re.findall(r"[A-Za-z0-9]+", password) if len(run) >= 3),
    }


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("form", ["url", "url-encoded", "keywords", "keywords-quoted"])
def test_a_database_url_error_never_quotes_the_password(password: str, form: str) -> None:
    command = ("relay",) if form.startswith("url") else ("buried", "list")

    # In this process (a new interpreter a case costs a second); one form of the
    # first password as the real console script.
    run = run_outbox if password == PASSWORDS[0] else run_outbox_here
    result = run(*command, OUTBOX_DATABASE_URL=_forms(password)[form], **RELAY)

    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"outbox {' '.join(command)}: OUTBOX_DATABASE_URL: ")
    # Refused as written (2), or parsed and unreachable (1): never anything else.
    assert result.returncode == (1 if "cannot connect" in lines[0] else 2), lines[0]
    for piece in _pieces(password):
        assert piece not in result.stderr, f"{piece!r} in {lines[0]!r}"
