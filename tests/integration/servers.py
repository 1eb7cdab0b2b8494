"""Private PostgreSQL 15 servers: a primary, its streaming standby, switchovers.

What production runs and the shared test server cannot show: a failover, a
partition. Each server is Debian's PostgreSQL 15 in a temporary directory, on
a port of its own, run as the ``postgres`` OS user (PostgreSQL refuses root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from tests.integration.process import free_port
from tests.tools import require

BIN = Path("/usr/lib/postgresql/15/bin")


class Server:
    """One private server; ``url`` reaches its database ``test`` on ``host``."""

    def __init__(self, data: Path, port: int, *, listen: str = "127.0.0.1") -> None:
        self.data = data
        self.port = port
        self.listen = listen

    def url(self, host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/test"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=60)

    def start(self) -> None:
        log = self.data.parent / f"{self.data.name}.log"
        self._run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(log), "-o", self._opts())

    def _opts(self) -> str:
        return f"-p {self.port} -c listen_addresses='{self.listen}' -k '' -c fsync=off"

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data), check=False)

    def promote(self) -> None:
        self._run("pg_ctl", "promote", "-w", "-D", str(self.data))

    def execute(self, statement: str, dbname: str = "postgres") -> None:
        url = f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(statement.encode())

    def wait_accepting(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:  # a real process must start
            try:
                with psycopg.connect(self.url().replace("/test", "/postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextmanager
def primary(*, listen: str = "127.0.0.1", settings: str = "") -> Iterator[Server]:
    """A fresh primary with a database ``test``, stopped and removed afterwards;
    ``settings``: lines for its postgresql.conf."""
    require(str(BIN / "initdb"), "postgresql-15")
    folder = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
    shutil.chown(folder, "postgres") if os.geteuid() == 0 else None
    server = Server(folder / "primary", free_port(), listen=listen)
    try:
        server._run("initdb", "-A", "trust", "-U", "postgres", "-D", str(server.data))
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 4\nwal_keep_size = 256MB\n")
            conf.write(settings)
        with (server.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        server.start()
        server.wait_accepting()
        server.execute("CREATE DATABASE test")
        yield server
    finally:
        for data in folder.iterdir():
            if data.is_dir():
                Server(data, 0).stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def standby(of: Server, *, synchronous: bool = True) -> Server:
    """A streaming standby of ``of`` beside it (removed with it). ``synchronous``:
    ``of`` then commits only what the standby has, so a crash loses nothing."""
    server = Server(of.data.parent / "standby", free_port(), listen=of.listen)
    of._run(
        "pg_basebackup", "-R", "-X", "stream", "-c", "fast", "-D", str(server.data),
        "-h", "127.0.0.1", "-p", str(of.port), "-U", "postgres",
    )  # fmt: skip
    server.start()
    server.wait_accepting()
    if synchronous:  # set after the copy: the standby, once promoted, waits for nobody
        of.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        of.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    with psycopg.connect(of.url().replace("/test", "/postgres"), autocommit=True) as conn:
        want = "sync" if synchronous else "async"
        while conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() != [(want,)]:
            if time.monotonic() > deadline:
                raise AssertionError("the standby never streamed")
            time.sleep(0.1)
    return server
