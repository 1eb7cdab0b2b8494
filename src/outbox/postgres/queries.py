"""The store's SQL, loaded once from sql/queries.sql.

Queries are typed LiteralString so psycopg's type checks see that no query is
built from strings at run time.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

__all__ = ["QUERIES", "load_queries", "migrations"]

_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
# Whole-line comments stay in the file: psycopg parses a statement longer
# than 4,096 characters anew on every execution instead of caching it.
_COMMENT_LINE = re.compile(r"^\s*--.*\n", re.MULTILINE)
# Indentation too: no statement has a string literal that spans lines.
_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)


def load_queries(package: str) -> dict[str, LiteralString]:
    """The queries in ``package``'s sql/queries.sql, by name."""
    text = resources.files(package).joinpath("sql/queries.sql").read_text("utf-8")
    parts = _HEADER.split(text)
    # The file is part of the package, so its text is as literal as a string
    # in the source.
    queries: dict[str, LiteralString] = {
        name: _INDENT.sub("", _COMMENT_LINE.sub("", body)).strip()
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    return queries


QUERIES = load_queries(__package__)


def migrations() -> list[tuple[int, str, LiteralString]]:
    """The schema migrations shipped in the package: (version, name, sql), in order."""
    folder = resources.files(__package__).joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            sql: LiteralString = entry.read_text("utf-8")
            found.append((int(match[1]), match[2], sql))
    return sorted(found)
