"""The PostgreSQL a benchmark runs against: the one named, or an embedded one for the run."""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def postgres(url: str | None) -> Iterator[str]:
    """Yield ``url``, or start an embedded PostgreSQL (deleted afterwards) and yield its URL."""
    if url:
        yield url
        return
    from outbox.service.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        os.chmod(tmp, 0o755)  # as root, the server runs as its own user
        server = EmbeddedPostgres(Path(tmp) / "pgdata", delete=True)
        try:
            yield server.start()
        finally:
            server.stop()


def listening(port: int, timeout: float = 10) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


LOCAL = "postgresql://postgres@127.0.0.1:5432/test"


def arguments(
    doc: str | None, *, rounds: int | None = None, baseline: bool = False, local: bool = False
) -> argparse.ArgumentParser:
    """A bench's parser, described by its docstring's first paragraph, with the
    options every bench shares: --database-url (default OUTBOX_BENCH_DATABASE_URL,
    else an embedded PostgreSQL for the run, or with ``local`` the CI machine's),
    --rounds (when it has rounds) and --baseline REV (when it compares with the
    tree at REV: its src/ is exported and run beside the working tree's)."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0], prog=f"python -m bench {_name()}"
    )
    default = os.environ.get("OUTBOX_BENCH_DATABASE_URL", LOCAL if local else None)
    parser.add_argument(
        "--database-url", default=default, help="PostgreSQL to run against (default: %(default)s)"
    )
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="alternating rounds")
    if baseline:
        parser.add_argument(
            "--baseline", default="HEAD", help="the tree compared with (default: HEAD)"
        )
    return parser


def local_arguments(doc: str | None, *, rounds: int | None = None) -> argparse.ArgumentParser:
    """arguments() against the local PostgreSQL by default."""
    return arguments(doc, rounds=rounds, local=True)


def _name() -> str:
    import sys

    import __main__

    if sys.argv[0].startswith("python -m bench "):  # set by python -m bench NAME
        return sys.argv[0].removeprefix("python -m bench ")
    spec = getattr(__main__, "__spec__", None)
    return (spec.name if spec else "").removeprefix("bench.") or "<name>"
