"""The shipped alerts with real Prometheus tools: promtool, and a live Prometheus
scraping a real relay that buries a message, with Alertmanager paging a webhook."""

from __future__ import annotations

import json
import string
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
from tests.integration import recording
from tests.integration.process import RelayProcess, add_messages, free_port, wait_until
from tests.tools import require
from tools.manifests import documents, render

HERE = Path(__file__).parent


RELEASES = {
    "default": ({}, "outbox", "prod"),
    "nameOverride": ({"nameOverride": "mailer"}, "shop", "payments"),
    "fullnameOverride": ({"fullnameOverride": "outbox"}, "outbox", "prod"),
}


def rule_groups(values: dict[str, Any], name: str, namespace: str) -> list[dict[str, Any]]:
    """The alert groups the chart renders for a release."""
    values = {**values, "monitoring": {"prometheusRule": {"enabled": True}}}
    [rule] = [
        d
        for d in documents(render(values, name=name, namespace=namespace))
        if d["kind"] == "PrometheusRule"
    ]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def write_rules(folder: Path, values: dict[str, Any], name: str, namespace: str) -> Path:
    rules = folder / "rules.yaml"
    groups = rule_groups(values, name, namespace)
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return rules


def fullname(values: dict[str, Any], name: str) -> str:
    docs = documents(render(values, name=name, namespace="x"))
    [relay] = [
        d for d in docs if d["kind"] == "Deployment" and "controller" not in d["metadata"]["name"]
    ]
    found: str = relay["metadata"]["name"]
    return found


def test_rules_pass_promtool_check(tmp_path: Path) -> None:
    promtool = require("promtool", "prometheus")

    result = subprocess.run(
        [promtool, "check", "rules", str(write_rules(tmp_path, {}, "outbox", "prod"))],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "11 rules found" in result.stdout


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_each_alert_fires_when_it_should_and_not_otherwise(tmp_path: Path, release: str) -> None:
    promtool = require("promtool", "prometheus")
    values, name, namespace = RELEASES[release]
    write_rules(tmp_path, values, name, namespace)
    full = fullname(values, name)
    cases = string.Template((HERE / "alerts_test.yaml").read_text()).substitute(
        job=f"{full}-metrics",
        controller=f"{full}-controller-metrics",
        namespace=namespace,
        fullname=full,
        release=name,
    )
    (tmp_path / "alerts_test.yaml").write_text(cases)

    result = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_selectors_follow_the_release(tmp_path: Path) -> None:
    exprs = [r["expr"] for g in rule_groups({}, "outbox", "prod") for r in g["rules"]]
    other = [r["expr"] for g in rule_groups({}, "billing", "finance") for r in g["rules"]]

    for expr in exprs:
        assert 'namespace="prod"' in expr, expr
        assert 'job="outbox-outbox-relay-' in expr, expr
    assert all('namespace="finance"' in e and 'job="billing-outbox-relay-' in e for e in other)


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
        OUTBOX_BACKLOG_INTERVAL="1s",
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
    rules = write_rules(tmp_path, {}, "outbox", "prod")
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
                        # As the release's ServiceMonitor names it: the metrics Service.
                        "job_name": "outbox-outbox-relay-metrics",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{relay.port}"],
                                "labels": {"namespace": "prod"},
                            }
                        ],
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
    query = urllib.parse.quote('up{job="outbox-outbox-relay-metrics"} == 1')
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?query={query}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(json.load(response)["data"]["result"])
    except OSError:
        return False
