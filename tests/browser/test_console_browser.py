"""The operator console in a real browser: Playwright driving Debian's
Chromium against a real `outbox ui`, a real `outbox relay` and the real
Prometheus that scrapes it, over a real PostgreSQL. Sign in with a token, read
the overview and its chart, filter the buried messages by error text, requeue
all that match after the count and see them delivered, pause a topic, and a
viewer's pages. The overview and buried pages are saved as screenshots
(OUTBOX_SCREENSHOTS=DIR keeps them: docs/operators/img has them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
import yaml
from playwright.sync_api import Browser, Page, sync_playwright

from outbox import new_message
from outbox.postgres import add_sync, migrate
from tests.conftest import fresh_schema
from tests.integration import recording
from tests.integration.process import (
    REPO,
    RelayProcess,
    count,
    free_port,
    outbox_env,
    query,
    wait_until,
)
from tests.tools import require

VIEWER = "viewer-token-0123456789"
OPERATOR = "operator-token-0123456789"
ERROR = "receiver timed out after 10s"


class Stack:
    """A database with buried messages, a relay, Prometheus scraping it, and
    the console (the real command) reading Prometheus."""

    def __init__(self, db: str, tmp: Path) -> None:
        self.db, self.tmp = db, tmp
        self.record = tmp / "delivered"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.relay = RelayProcess(
            tmp,
            OUTBOX_DATABASE_URL=db,
            OUTBOX_HANDLERS="tests.integration.recording:file_handlers",
            OUTBOX_INTERVAL="200ms",
            OUTBOX_BACKLOG_INTERVAL="1s",
            RECORDING_FILE=str(self.record),
        )
        self.prom_port = free_port()
        (tmp / "prom.yaml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s"},
                    "scrape_configs": [
                        {
                            "job_name": "outbox",
                            "static_configs": [{"targets": [f"127.0.0.1:{self.relay.port}"]}],
                        }
                    ],
                }
            )
        )
        prometheus = require("prometheus", "prometheus")
        self._start(
            [
                prometheus,
                f"--config.file={tmp / 'prom.yaml'}",
                f"--storage.tsdb.path={tmp / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
            ],
            "prom.log",
        )
        tokens = tmp / "tokens"
        tokens.write_text(f"ana viewer {VIEWER}\nolu operator {OPERATOR}\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = outbox_env(
            OUTBOX_DATABASE_URL=db,
            OUTBOX_UI_PORT=str(self.port),
            OUTBOX_UI_TOKENS_FILE=str(tokens),
            OUTBOX_UI_PROMETHEUS_URL=f"http://127.0.0.1:{self.prom_port}",
        )
        with (tmp / "ui.log").open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "outbox.service.cli", "ui"],
                    env=env,
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def _start(self, args: list[str], log: str) -> None:
        with (self.tmp / log).open("wb") as out:
            self.procs.append(subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        self.relay.stop()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def prometheus_has(self, promql: str) -> bool:
        url = (
            f"http://127.0.0.1:{self.prom_port}/api/v1/query?"
            f"{urllib.parse.urlencode({'query': promql})}"
        )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return b'"result":[{' in r.read()
        except OSError:
            return False


def bury(db: str, topic: str, n: int, error: str) -> None:
    """``n`` messages of ``topic``, buried with ``error`` as if a receiver failed."""
    with psycopg.connect(db, autocommit=True) as conn:
        with conn.transaction():
            add_sync(conn, *(new_message(topic, {"code": f"{i:06d}"}) for i in range(n)))
        conn.execute(
            "UPDATE outbox_messages SET buried_at = now(), last_error = %s, attempts = 3 "
            "WHERE topic = %s AND buried_at IS NULL",
            (error, topic),
        )


@pytest.fixture(scope="module")
def stack(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require("chromium", "chromium")
    with fresh_schema(postgres_url) as db:
        anyio.run(migrate, db)
        query(db, recording.DDL)
        # The relay's topic: a pause target with nothing waiting; and buried ones.
        bury(db, recording.TOPIC, 6, ERROR)
        bury(db, recording.TOPIC, 2, "400 bad request")
        stack = Stack(db, tmp_path_factory.mktemp("console"))
        try:
            stack.relay.wait_ready()
            wait_until("the console to listen", lambda: _answers(f"{stack.url}/healthz"), 30)
            wait_until(
                "Prometheus to hold the relays' backlog",
                lambda: stack.prometheus_has("outbox_buried_messages > 0"),
                60,
            )
            yield stack
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Browser]:
    """Chromium, started after the stack (Playwright's loop holds the thread)."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium",
            args=["--no-sandbox"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, stack: Stack) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


def sign_in(page: Page, stack: Stack, token: str) -> None:
    page.goto(f"{stack.url}/")
    assert "/signin" in page.url
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/")


def shoot(page: Page, name: str, tmp: Path) -> None:
    path = tmp / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    keep = os.environ.get("OUTBOX_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / name)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status) == 200
    except OSError:
        return False


def test_sign_in_and_the_overview_shows_counts_and_a_chart(page: Page, stack: Stack) -> None:
    sign_in(page, stack, OPERATOR)
    row = page.locator(f'tr[data-topic="{recording.TOPIC}"]')
    cells = row.locator("td").all_inner_texts()
    assert cells[4] == "8", cells  # buried, from the relays' measurement
    assert "olu · operator" in page.inner_text("header")
    wait_until(
        "the chart to have points",
        lambda: "<polyline" in page.request.get(f"{stack.url}/charts/backlog.svg").text(),
        30,
    )
    page.reload()
    chart = page.locator('img[alt="Backlog"]')
    chart.scroll_into_view_if_needed()
    page.wait_for_function(
        "img => img.complete && img.naturalWidth > 0", arg=chart.element_handle()
    )
    shoot(page, "console-overview.png", stack.tmp)


def test_filter_the_buried_by_error_text_and_requeue_all_that_match(
    page: Page, stack: Stack
) -> None:
    sign_in(page, stack, OPERATOR)
    page.goto(f"{stack.url}/buried")
    page.fill('input[name="error_contains"]', "TIMED OUT")
    page.click("form.filters button")
    rows = page.locator("tbody tr[data-id]")
    assert rows.count() == 6
    assert all(ERROR in t for t in rows.locator("td:last-child").all_inner_texts())
    shoot(page, "console-buried.png", stack.tmp)

    page.click("text=Requeue all that match…")
    assert page.inner_text("h1") == "Requeue 6 buried messages?"
    page.click('[data-test="confirm"]')
    assert "Requeued 6 messages." in page.inner_text('[role="status"]')
    wait_until("the requeued ones delivered", lambda: len(recording.recorded(stack.record)) >= 6)
    left = count(stack.db, "SELECT count(*) FROM outbox_messages")
    assert left == 2, "the two with another error stay buried"


def test_pause_a_topic(page: Page, stack: Stack) -> None:
    sign_in(page, stack, OPERATOR)
    page.goto(f"{stack.url}/topics")
    row = page.locator(f'tr[data-topic="{recording.TOPIC}"]')
    row.locator("button", has_text="Pause").click()
    assert f"{recording.TOPIC} paused." in page.inner_text('[role="status"]')
    assert "paused" in page.locator(f'tr[data-topic="{recording.TOPIC}"]').inner_text()
    enabled = count(
        stack.db,
        f"SELECT count(*) FROM outbox_topics WHERE topic = '{recording.TOPIC}' AND enabled",
    )
    assert enabled == 0
    page.locator(f'tr[data-topic="{recording.TOPIC}"] button', has_text="Resume").click()
    assert f"{recording.TOPIC} resumed." in page.inner_text('[role="status"]')


def test_a_viewer_sees_no_change_buttons_and_no_payload(page: Page, stack: Stack) -> None:
    sign_in(page, stack, VIEWER)
    for path in ("/", "/buried", "/topics"):
        page.goto(f"{stack.url}{path}")
        buttons = page.locator("main button").all_inner_texts()
        assert not [b for b in buttons if b not in ("Filter", "Count now")], (path, buttons)
    page.goto(f"{stack.url}/buried")
    page.locator("tbody tr[data-id] a").first.click()
    assert "hidden" in page.inner_text("dl.facts")
    assert "Reveal" not in page.content()
    page.click("text=Sign out")
    page.wait_for_url("**/signin")
    page.goto(f"{stack.url}/")
    assert "/signin" in page.url
