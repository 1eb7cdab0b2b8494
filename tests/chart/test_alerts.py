"""The shipped alerts with real Prometheus tools: promtool, and a live Prometheus
scraping a real relay that buries a message, with Alertmanager paging a webhook."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from outbox.postgres import migrate
from tests.chart.render import CHART
from tests.integration import recording
from tests.integration.process import RelayProcess, add_messages, free_port, wait_until
from tests.tools import require

HERE = Path(__file__).parent


def write_rules(folder: Path) -> Path:
    rules = folder / "rules.yaml"
    groups = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return rules


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    promtool = require("promtool", "prometheus")

    result = subprocess.run(
        [promtool, "check", "rules", str(write_rules(tmp_path))], capture_output=True, text=True
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 rules found" in result.stdout


def test_each_alert_fires_when_it_should_and_not_otherwise(tmp_path: Path) -> None:
    promtool = require("promtool", "prometheus")
    write_rules(tmp_path)
    shutil.copy(HERE / "alerts_test.yaml", tmp_path)

    result = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:  # the stdlib's handler name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        server.shutdown()
        server.server_close()


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)


def test_buried_message_pages_through_prometheus_and_alertmanager(
    tmp_path: Path, pg_conninfo: str, webhook: tuple[int, list[dict[str, Any]]]
) -> None:
    prometheus = require("prometheus", "prometheus")
    alertmanager = require("prometheus-alertmanager", "prometheus-alertmanager")
    hook_port, received = webhook
    anyio.run(migrate, pg_conninfo)
    relay = RelayProcess(
        tmp_path,
        OUTBOX_DATABASE_URL=pg_conninfo,
        OUTBOX_HANDLERS="tests.integration.recording:failing_handlers",
        OUTBOX_MAX_ATTEMPTS="2",
        OUTBOX_INTERVAL="200ms",
    )
    am_port, prom_port = free_port(), free_port()
    (tmp_path / "am.yaml").write_text(
        yaml.safe_dump(
            {
                "route": {
                    "receiver": "test",
                    "group_by": ["alertname", "topic"],
                    "group_wait": "0s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {"name": "test", "webhook_configs": [{"url": f"http://127.0.0.1:{hook_port}/"}]}
                ],
            }
        )
    )
    rules = write_rules(tmp_path)
    (tmp_path / "prom.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
                },
                "scrape_configs": [
                    {
                        "job_name": "outbox-relay",
                        "static_configs": [{"targets": [f"127.0.0.1:{relay.port}"]}],
                    }
                ],
            }
        )
    )
    started = []
    try:
        started.append(
            _start(
                [
                    alertmanager,
                    f"--config.file={tmp_path / 'am.yaml'}",
                    f"--storage.path={tmp_path / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                tmp_path / "am.log",
            )
        )
        started.append(
            _start(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prom.yaml'}",
                    f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                tmp_path / "prom.log",
            )
        )
        relay.wait_ready()
        # Prometheus must hold a sample of the counter at 0 before the burial:
        # increase() needs two.
        wait_until("a first scrape", lambda: _scraped(prom_port), 60)
        add_messages(pg_conninfo, recording.FAILING, 1)

        def paged() -> bool:
            alerts = [a for r in received for a in r.get("alerts", [])]
            return any(
                a["labels"].get("alertname") == "OutboxMessagesBuried"
                and a["labels"].get("topic") == recording.FAILING
                and a["status"] == "firing"
                for a in alerts
            )

        try:
            wait_until("the page", paged, 60)
        except AssertionError as exc:
            logs = "\n".join((tmp_path / f).read_text()[-3000:] for f in ("prom.log", "am.log"))
            raise AssertionError(f"{exc}; relay:\n{relay.log[-2000:]}\n{logs}") from None
    finally:
        relay.stop()
        for proc in started:
            proc.terminate()
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _scraped(prom_port: int) -> bool:
    query = urllib.parse.quote(f'outbox_buried_total{{topic="{recording.FAILING}"}}')
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?query={query}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(json.load(response)["data"]["result"])
    except OSError:
        return False
