"""Binaries some tests need that only Debian packages provide.

On a newcomer's machine without them those tests skip, saying what to install;
CI installs them and sets OUTBOX_TEST_REQUIRE_ALL=1, under which a missing
binary fails the test instead.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require(binary: str, package: str) -> str:
    """The path of ``binary``; skip (or, on CI, fail) when it is not installed."""
    path = shutil.which(binary)
    if path:
        return path
    reason = f"{binary} is not installed (apt-get install {package})"
    if os.environ.get("OUTBOX_TEST_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
