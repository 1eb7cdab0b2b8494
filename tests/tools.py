"""Binaries and servers some tests need that only Debian packages provide.

On a newcomer's machine without them those tests skip, saying what to install;
CI installs them and sets OUTBOX_TEST_REQUIRE_ALL=1, under which a missing
binary fails the test instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
from typing import NoReturn

import pytest


def require(binary: str, package: str) -> str:
    """The path of ``binary``; skip (or, on CI, fail) when it is not installed."""
    path = shutil.which(binary)
    if path:
        return path
    _missing(f"{binary} is not installed (apt-get install {package})")


def require_library(pattern: str, package: str) -> str:
    """The path of the shared library ``pattern`` (a glob) names; skip or fail as above."""
    found = sorted(glob.glob(pattern))
    if found:
        return found[0]
    _missing(f"{pattern} is not installed (apt-get install {package})")


def require_root(what: str) -> None:
    """Skip (or, on CI, fail) unless this process runs as root, which ``what`` needs."""
    if os.geteuid() != 0:
        _missing(f"{what} needs root")


def require_service(host: str, port: int, what: str) -> None:
    """Skip (or, on CI, fail) unless a server answers on ``host:port`` (``what``)."""
    try:
        socket.create_connection((host, port), 2).close()
    except OSError:
        _missing(f"no {what} answers on {host}:{port} (CI runs one there)")


def _missing(reason: str) -> NoReturn:
    if os.environ.get("OUTBOX_TEST_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
