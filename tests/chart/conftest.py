from __future__ import annotations

from typing import Any

import pytest

from tests.chart.values import VALUE_SETS
from tools.manifests import documents, render


@pytest.fixture(scope="session", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The chart rendered with each value set in turn."""
    return documents(render(VALUE_SETS[request.param]))
