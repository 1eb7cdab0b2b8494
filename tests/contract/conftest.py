"""The ``store`` fixture: every contract test runs against every backend."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.memory import MemoryStore
from outbox.store import Store


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Store[Any]:
    if request.param == "memory":
        return MemoryStore()
    pg: Store[Any] = request.getfixturevalue("pg_store")
    return pg
