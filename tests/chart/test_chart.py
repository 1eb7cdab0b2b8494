"""The Helm chart rendered by the real Helm SDK and checked against real schemas.

What this cannot prove without a cluster: admission (webhooks, the API
server's own validation of the CRD and defaulting), server-side apply, Helm
hooks actually running in order, garbage collection of owned objects, and
that the pods start. docs/operators/kubernetes.md says so too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as prom

from outbox import __name__ as package
from tests.chart.values import KUBE, VALUE_SETS, by_kind, containers
from tests.unit.test_crd import valid as valid_outboxtopic
from tools.manifests import CHART, K8S, documents, plain_manifests, render


def test_lint_is_clean() -> None:
    result = helm_python.lint(str(CHART), strict=True, kube_version=f"v{KUBE}")

    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


def test_every_manifest_validates(rendered: list[dict[str, Any]]) -> None:
    for doc in rendered:
        kind = doc["kind"]
        if kind == "OutboxTopic":
            assert valid_outboxtopic(doc), doc
        elif kind == "PrometheusRule":
            prom.PrometheusRule.model_validate(doc)
        elif kind == "ServiceMonitor":
            prom.ServiceMonitor.model_validate(doc)
        elif kind in ("KopfPeering", "ClusterKopfPeering"):
            assert doc["apiVersion"] == "kopf.dev/v1"
        else:
            kubernetes_validate.validate(doc, KUBE, strict=True)


def test_containers_are_locked_down(rendered: list[dict[str, Any]]) -> None:
    assert containers(rendered)
    for name, pod, c in containers(rendered):
        ctx = c["securityContext"]
        assert ctx["runAsNonRoot"] is True, name
        assert ctx["readOnlyRootFilesystem"] is True, name
        assert ctx["allowPrivilegeEscalation"] is False, name
        assert ctx["capabilities"]["drop"] == ["ALL"], name
        assert ctx["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert c["resources"]["requests"], name
        assert c["resources"]["limits"]["memory"], name


def test_no_secret_value_is_rendered(rendered: list[dict[str, Any]]) -> None:
    for name, _, c in containers(rendered):
        for env in c.get("env", []):
            if env["name"] in (
                "OUTBOX_DATABASE_URL",
                "OUTBOX_SMTP_USERNAME",
                "OUTBOX_SMTP_PASSWORD",
                "OUTBOX_UI_SESSION_KEY",
            ):
                assert "value" not in env, (name, env["name"])
                assert env["valueFrom"]["secretKeyRef"]["name"], (name, env["name"])
    assert by_kind(rendered, "ConfigMap") == []
    secrets = by_kind(rendered, "Secret")
    assert all("dev-database" in s["metadata"]["name"] for s in secrets)  # dev's, password-less
    assert all("password" not in json.dumps(s.get("stringData", {})).lower() for s in secrets)


def test_relay_probes_use_the_real_endpoints_and_grace_outlasts_timeout(
    rendered: list[dict[str, Any]],
) -> None:
    [relay] = [
        d for d in by_kind(rendered, "Deployment") if d["metadata"]["name"].endswith("outbox-relay")
    ]
    pod = relay["spec"]["template"]["spec"]
    [c] = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http-metrics"]

    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert env["OUTBOX_HTTP_PORT"] == str(port)
    assert pod["terminationGracePeriodSeconds"] > 30  # OUTBOX_TIMEOUT 30s
    assert env["OUTBOX_TIMEOUT"] == "30s"
    assert pod["automountServiceAccountToken"] is False
    assert c["args"] == ["relay"]


def test_rbac_grants_no_more_than_the_controller_needs(rendered: list[dict[str, Any]]) -> None:
    roles = by_kind(rendered, "Role") + by_kind(rendered, "ClusterRole")
    [role] = roles
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    peering = "clusterkopfpeerings" if role["kind"] == "ClusterRole" else "kopfpeerings"

    assert rules == {
        (("outbox.dev",), ("outboxtopics",)): {"get", "list", "watch", "patch"},
        (("outbox.dev",), ("outboxtopics/status",)): {"get", "patch"},
        (("",), ("events",)): {"create"},
        (("kopf.dev",), (peering,)): {"get", "list", "watch", "patch"},
    }
    [relay_account] = [
        a for a in by_kind(rendered, "ServiceAccount") if a["metadata"]["name"].endswith("-relay")
    ]
    assert relay_account["automountServiceAccountToken"] is False
    bound = {
        s["name"]
        for b in by_kind(rendered, "RoleBinding") + by_kind(rendered, "ClusterRoleBinding")
        for s in b["subjects"]
    }
    assert bound == {
        a["metadata"]["name"]
        for a in by_kind(rendered, "ServiceAccount")
        if a["metadata"]["name"].endswith("-controller")
    }


def test_defaults_install_what_production_needs() -> None:
    docs = documents(render({}))
    kinds = sorted({d["kind"] for d in docs})

    assert kinds == sorted(
        [
            "Deployment",
            "Job",
            "KopfPeering",
            "OutboxTopic",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )
    [job] = by_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate", "--wait", "60s"]
    assert job["spec"]["activeDeadlineSeconds"] == 600
    relay = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "outbox-outbox-relay"
    )
    assert relay["spec"]["replicas"] == 2
    assert relay["spec"]["template"]["spec"]["topologySpreadConstraints"]
    topics = {t["spec"]["topic"] for t in by_kind(docs, "OutboxTopic")}
    assert topics == {"mail.login_link", "mail.email_change"}


def test_monitoring_and_hpa_follow_their_switches() -> None:
    on = documents(render(VALUE_SETS["monitoring"]))
    monitors = by_kind(on, "ServiceMonitor")
    services = {d["metadata"]["name"]: d for d in by_kind(on, "Service")}
    for monitor in monitors:
        # job is the Service's name: unique per release, what the alerts select.
        assert "jobLabel" not in monitor["spec"]
        assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        assert [
            n for n, svc in services.items() if wanted.items() <= svc["spec"]["selector"].items()
        ], monitor["metadata"]["name"]
    assert sorted(services) == [
        "outbox-outbox-relay-controller-metrics",
        "outbox-outbox-relay-metrics",
    ]
    [rule] = by_kind(on, "PrometheusRule")
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts == [
        "OutboxMessagesBuried",
        "OutboxBuriedMessagesUnattended",
        "OutboxMessagesDropped",
        "OutboxBacklogStale",
        "OutboxSnapshotHeld",
        "OutboxKeyBlocked",
        "OutboxDeliveriesFailing",
        "OutboxDatabaseUnreachable",
        "OutboxRelaysNotPolling",
        "OutboxRelaysAbsent",
        "OutboxControllerAbsent",
    ]
    runbooks = (CHART.parents[1] / "docs" / "operators" / "runbooks.md").read_text().lower()
    for r in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        assert {"severity"} <= set(r["labels"])
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"])
        anchor = r["annotations"]["runbook_url"].split("#")[1]
        assert f"## {anchor}" in runbooks
    [hpa] = by_kind(documents(render(VALUE_SETS["hpa"])), "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 2
    relay = next(
        d
        for d in by_kind(documents(render(VALUE_SETS["hpa"])), "Deployment")
        if d["metadata"]["name"] == "outbox-outbox-relay"
    )
    assert "replicas" not in relay["spec"]


def test_migrate_keeps_the_triggers_the_values_name() -> None:
    values = {"migrations": {"allowTriggers": ["audit_copy", "audit_log"]}}
    [job] = by_kind(documents(render(values)), "Job")

    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "migrate", "--wait", "60s", "--allow-trigger", "audit_copy", "--allow-trigger", "audit_log",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"relay": {"replicas": "two"}}, "replicas"),
        ({"relay": {"timeout": "soon"}}, "timeout"),
        ({"relay": {"batchSize": 10}}, "batchSize"),
        ({"smtp": {"tls": "ssl"}}, "tls"),
        ({"database": {"password": "hunter2"}}, "password"),
        ({"relay": {"logLevel": "loud"}}, "logLevel"),
        ({"tracing": {"sampler": "sometimes"}}, "sampler"),
        ({"tracing": {"samplerArg": "half"}}, "samplerArg"),
        ({"tracing": {"endpoint": "otel-collector:4318"}}, "endpoint"),
        ({"migrations": {"allowTriggers": ["audit; DROP"]}}, "allowTriggers"),
        ({"ui": {"basePath": "outbox/"}}, "basePath"),
        ({"ui": {"traceUrl": "https://tempo.example/trace/"}}, "traceUrl"),
        ({"ui": {"auth": {"proxy": {"addresses": ["everywhere"]}}}}, "addresses"),
    ],
)
def test_bad_values_are_refused_by_the_schema(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=complaint):
        render(values)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"relay": {"lease": "20s", "timeout": "30s"}}, "must outlast relay.timeout"),
        ({"relay": {"terminationGracePeriodSeconds": 20}}, "must exceed relay.timeout"),
        ({"tracing": {"enabled": True}}, "tracing.endpoint is required"),
        ({"ui": {"enabled": True}}, "ui.enabled needs authentication"),
        (
            {"ui": {"enabled": True, "auth": {"proxy": {"addresses": ["10.0.0.0/8"]}}}},
            "ui.auth.proxy needs operatorGroups or viewerGroups",
        ),
    ],
)
def test_inconsistent_values_fail_the_render(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(Exception, match=complaint):
        render(values)


def test_crd_has_one_source() -> None:
    for crd in (CHART / "crds").glob("*.yaml"):
        assert crd.read_text() == (K8S / "crds" / crd.name).read_text(), crd.name


def test_plain_manifests_are_in_step_with_the_chart() -> None:
    for name, text in plain_manifests().items():
        assert (K8S / name).read_text() == text, f"k8s/{name} drifted: run `make manifests`"
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert all((K8S / path).exists() for path in listed)


def test_app_version_is_the_package_version() -> None:
    import importlib.metadata

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == importlib.metadata.version("outbox-relay")
    assert package == "outbox"


def test_notes_tell_the_next_steps() -> None:
    notes = render({})["NOTES.txt"]

    assert "outbox buried list" in notes
    assert "get outboxtopics" in notes
    assert "prometheusRule.enabled=true" in notes


def test_chart_dir_holds_what_helm_packages() -> None:
    assert {p.name for p in CHART.iterdir()} >= {
        "Chart.yaml",
        "values.yaml",
        "values.schema.json",
        "crds",
        "templates",
        "files",
    }
    assert isinstance(json.loads((CHART / "values.schema.json").read_text()), dict)
    assert Path(CHART / "templates" / "NOTES.txt").exists()


def test_the_console_is_its_own_locked_down_component_behind_authentication() -> None:
    docs = documents(render(VALUE_SETS["console"]))
    [ui] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-ui")]
    pod = ui["spec"]["template"]["spec"]
    assert pod["serviceAccountName"].endswith("-ui")
    assert pod["automountServiceAccountToken"] is False
    [sa] = [d for d in by_kind(docs, "ServiceAccount") if d["metadata"]["name"].endswith("-ui")]
    assert sa["automountServiceAccountToken"] is False
    [c] = pod["containers"]
    assert c["args"] == ["ui"]
    env = {e["name"]: e for e in c["env"]}
    assert env["OUTBOX_UI_HOST"]["value"] == "0.0.0.0"
    assert env["OUTBOX_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "outbox-console-db"
    assert env["OUTBOX_UI_SESSION_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "outbox-ui-session"
    tokens = env["OUTBOX_UI_TOKENS_FILE"]["value"]
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "tokens"]
    assert tokens.startswith(mount["mountPath"] + "/")
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == "tokens"]
    assert volume["secret"]["secretName"] == "outbox-ui-tokens"
    assert env["OUTBOX_UI_BASE_PATH"]["value"] == "/outbox"
    # Probes need no credentials: the health path, on the console's port.
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    [svc] = [d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-ui")]
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"] == ui["spec"]["selector"]["matchLabels"]
    [ingress] = by_kind(docs, "Ingress")
    [path] = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["path"] == "/outbox"
    assert path["backend"]["service"]["name"] == svc["metadata"]["name"]
    [policy] = [d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"].endswith("-ui")]
    assert policy["spec"]["podSelector"]["matchLabels"] == ui["spec"]["selector"]["matchLabels"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]

    # Nothing listed: nothing reaches it through the pod network.
    proxied = documents(render(VALUE_SETS["console behind a proxy"]))
    [policy] = [
        d for d in by_kind(proxied, "NetworkPolicy") if d["metadata"]["name"].endswith("-ui")
    ]
    assert policy["spec"]["ingress"] == []
    [ui] = [d for d in by_kind(proxied, "Deployment") if d["metadata"]["name"].endswith("-ui")]
    env = {
        e["name"]: e.get("value") for e in ui["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["OUTBOX_UI_PROXY_ADDRESSES"] == "10.0.0.0/8"
    assert (env["OUTBOX_UI_PROXY_OPERATOR_GROUPS"], env["OUTBOX_UI_PROXY_VIEWER_GROUPS"]) == (
        "sre",
        "dev",
    )
    assert "OUTBOX_UI_TOKENS_FILE" not in env
    assert not [d for d in documents(render({})) if d["metadata"]["name"].endswith("-ui")]
