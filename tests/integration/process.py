"""Start and drive real ``outbox`` processes for the tests."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio
import psycopg

from outbox import new_message
from outbox.postgres import PostgresStore, connect_pool

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def outbox_env(**settings: str) -> dict[str, str]:
    """This process's environment without OUTBOX_* settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(settings)
    return env


def run_outbox(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run ``outbox ARGS`` to completion (within a minute)."""
    return run_outbox_within(60, *args, **settings)


def run_outbox_within(
    timeout: float, /, *args: str, **settings: str
) -> subprocess.CompletedProcess[str]:
    """Run ``outbox ARGS`` to completion within ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, "-m", "outbox.service.cli", *args],
        env=outbox_env(**settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_outbox_here(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """Run ``outbox ARGS`` in this process, as run_outbox does in a new one: the
    environment is this process's without OUTBOX_* plus ``settings``; stdout and
    stderr are captured; the exit code is what the console script returns. An
    exception the command does not turn into its one line (a traceback) raises.

    For the many cases that check one line of output: a new interpreter costs
    about a second each. What a command changes in the process (the root
    logger, hidden secrets, the environment) is put back.
    """
    from outbox.message import max_payload
    from outbox.service import cli, logs

    environ, root = dict(os.environ), logging.getLogger()
    handlers, level, hidden = root.handlers[:], root.level, set(logs._hidden)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(outbox_env(**settings))
    max_payload.cache_clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        os.environ.clear()
        os.environ.update(environ)
        max_payload.cache_clear()
        root.handlers[:] = handlers
        root.setLevel(level)
        logs._hidden.clear()
        logs._hidden.update(hidden)
    return subprocess.CompletedProcess(["outbox", *args], code, out.getvalue(), err.getvalue())


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def listening(port: int, what: str, timeout: float = 10) -> None:
    """Return once something accepts connections on 127.0.0.1:``port`` (a server
    a test started), or AssertionError naming ``what``."""

    def accepts() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            return False
        return True

    wait_until(f"{what} to listen on port {port}", accepts, timeout)


class LocalServer:
    """A server process a test starts on a loopback port of its own, its data (if
    any) in ``folder``; a subclass says how to run it (``command()``) and its URL."""

    name = "server"

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        listening(self.port, self.name)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop it (SIGKILL: as a crash would)."""
        if self.proc is not None:
            self.proc.send_signal(signum)
            self.proc.wait(10)
            self.proc = None


class RelayProcess:
    """``outbox relay`` in a subprocess, its logs in a file, its HTTP port known."""

    def __init__(self, log_dir: Path, command: list[str] | None = None, /, **settings: str) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"relay-{self.port}.log"
        env = outbox_env(
            OUTBOX_HTTP_HOST="127.0.0.1",
            OUTBOX_HTTP_PORT=str(self.port),
            OUTBOX_LOG_FORMAT="json",
            **settings,
        )
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                command or [sys.executable, "-m", "outbox.service.cli", "relay"],
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def log_records(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.log.splitlines() if line.startswith("{")]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def status(self, path: str) -> int | None:
        try:
            return self.get(path)[0]
        except OSError:
            return None

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"relay exited with {self.proc.returncode}:\n{self.log}")
            return self.status("/readyz") == 200

        wait_until("the relay to be ready", ready, timeout)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def add_messages(conninfo: str, topic: str, n: int) -> list[uuid.UUID]:
    """Add ``n`` messages for ``topic`` in one transaction; return their ids."""
    msgs = [new_message(topic, {"n": i, "code": "493817"}, _now()) for i in range(n)]

    async def add() -> None:
        async with connect_pool(conninfo, max_size=1) as pool:
            store = PostgresStore(pool)
            async with store.begin() as tx:
                await store.add(tx, *msgs)

    anyio.run(add)
    return [m.id for m in msgs]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def query(conninfo: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(sql.encode())
        return cur.fetchall() if cur.description else []


def count(conninfo: str, sql: str) -> int:
    value = query(conninfo, sql)[0][0]
    assert isinstance(value, int)
    return value
