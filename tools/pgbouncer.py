"""A real PgBouncer in transaction mode in front of a PostgreSQL (tests and bench/)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pgbouncer(postgres_url: str, binary: str, *, pool_mode: str = "transaction") -> Iterator[str]:
    """Yield a URL through PgBouncer (``binary``) to ``postgres_url``'s server; every
    transaction of a client lands on the next server connection (server_round_robin),
    so what only works in one session fails every time, not now and then."""
    target = conninfo_to_dict(postgres_url)
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
    user = target.get("user") or "postgres"
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    server = f"host={target.get('host') or '127.0.0.1'} port={target.get('port') or 5432}"
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = {server}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder}/users.txt\n"
        f"pool_mode = {pool_mode}\nserver_round_robin = 1\ndefault_pool_size = 4\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
    )
    command = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        # As the server's own user where it listens on a socket directory
        # (the embedded server's is private to it), else as postgres.
        host = str(target.get("host") or "")
        owner = Path(host).owner() if host.startswith("/") else "postgres"
        for path in (folder, *folder.iterdir()):
            shutil.chown(path, owner)
        command = ["runuser", "-u", owner, "--", *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = make_conninfo(postgres_url, host="127.0.0.1", port=str(port), options="")
    try:
        deadline = time.monotonic() + 10
        while True:  # a real process must start
            try:
                with psycopg.connect(url, prepare_threshold=None, connect_timeout=2):
                    break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def warm(url: str, servers: int = 3) -> None:
    """Leave ``servers`` server connections idle in the pool: PgBouncer then hands
    them out in turn, so one client's consecutive transactions land in turn."""
    barrier = threading.Barrier(servers)

    def hold() -> None:
        with psycopg.connect(url, prepare_threshold=None) as conn:
            conn.execute("SELECT 1")  # in a transaction: a server connection of its own
            barrier.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
