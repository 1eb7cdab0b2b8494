"""The Helm chart rendered by the real Helm SDK and checked against real schemas.

What this cannot prove without a cluster: admission (webhooks, the API
server's own validation of the CRD and defaulting), server-side apply, Helm
hooks actually running in order, garbage collection of owned objects, and
that the pods start. The README says so too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1 as prom

from outbox import __name__ as package
from outbox.service.settings import (
    KIND_SETTINGS,
    RelaySettings,
    ServiceSettings,
    SmtpSettings,
    variables,
)
from tests.chart.render import CHART, K8S, documents, plain_manifests, render
from tests.tools import require
from tests.unit.test_crd import valid as valid_outboxtopic

KUBE = "1.31.0"
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "monitoring": {
        "monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    },
    "hpa": {"relay": {"autoscaling": {"enabled": True}}},
    "one relay": {"relay": {"replicas": 1, "podDisruptionBudget": {"enabled": False}}},
    "three relays": {"relay": {"replicas": 3}},
    "existing secrets": {
        "database": {"existingSecret": "pg-url", "secretKey": "dsn"},
        "smtp": {"enabled": True, "host": "smtp.example.com", "existingSecret": "smtp-login"},
        "nats": {"url": "nats://nats:4222", "user": "relay", "existingSecret": "nats-login"},
        "amqp": {"url": "amqps://rabbitmq:5671/", "username": "relay", "existingSecret": "mq"},
        "redis": {"url": "rediss://cache:6380/0", "username": "relay", "existingSecret": "cache"},
        "relay": {
            "extraEnv": [
                {
                    "name": "BILLING_WEBHOOK_SECRET",
                    "valueFrom": {"secretKeyRef": {"name": "billing", "key": "secret"}},
                }
            ]
        },
    },
    "cluster-wide": {"controller": {"watchAllNamespaces": True}},
    "tracing": {
        "tracing": {
            "enabled": True,
            "endpoint": "http://otel-collector.observability:4318",
            "sampler": "parentbased_traceidratio",
            "samplerArg": "0.25",
        }
    },
    "network policy": {
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        }
    },
    "dev": yaml.safe_load((CHART.parent / "dev-values.yaml").read_text()),
}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod spec, container) for every container of the release's own pods."""
    found: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job") and "dev-" not in d["metadata"]["name"]:
            pod = d["spec"]["template"]["spec"]
            found.extend((d["metadata"]["name"], pod, c) for c in pod["containers"])
    return found


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return documents(render(VALUE_SETS[request.param]))


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
        "OutboxKeyBlocked",
        "OutboxDeliveriesFailing",
        "OutboxDatabaseUnreachable",
        "OutboxRelaysNotPolling",
        "OutboxRelaysAbsent",
        "OutboxControllerAbsent",
    ]
    runbooks = (CHART.parents[1] / "docs" / "runbooks.md").read_text().lower()
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


def test_relay_fleet_settings_reach_the_pods_and_every_variable_is_a_setting() -> None:
    values = {"relay": {"concurrency": 200, "maxInFlight": 5, "unservedGrace": "15m"}}
    [relay] = [
        d
        for d in by_kind(documents(render(values)), "Deployment")
        if d["metadata"]["name"].endswith("outbox-relay")
    ]
    [c] = relay["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}

    assert env["OUTBOX_CONCURRENCY"]["value"] == "200"
    assert env["OUTBOX_MAX_IN_FLIGHT"]["value"] == "5"
    assert env["OUTBOX_UNSERVED_GRACE"]["value"] == "15m"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    known = {
        name
        for name, _, _ in variables(ServiceSettings, RelaySettings, SmtpSettings, *KIND_SETTINGS)
    }
    assert {n for n in env if n.startswith("OUTBOX_")} <= known
    with pytest.raises(helm_python.HelmValuesError):
        render({"relay": {"concurrency": 0}})


def test_the_allow_lists_reach_the_relays_and_the_controller() -> None:
    values = {
        "webhook": {"allow": ["https://billing.internal/hooks"]},
        "nats": {"allow": ["orders", "billing.events"]},
        "amqp": {"allow": ["orders", "billing.*"]},
        "redis": {"allow": ["orders", "audit:*"]},
    }
    pods = {
        d["metadata"]["name"]: {
            e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        for d in by_kind(documents(render(values)), "Deployment")
    }
    expected = {
        "OUTBOX_WEBHOOK_ALLOW": "https://billing.internal/hooks",
        "OUTBOX_NATS_ALLOW": "orders,billing.events",
        "OUTBOX_AMQP_ALLOW": "orders,billing.*",
        "OUTBOX_REDIS_ALLOW": "orders,audit:*",
    }
    # The controller marks a topic outside them Invalid, as the relays would refuse it.
    for name in ("outbox-outbox-relay", "outbox-outbox-relay-controller"):
        assert {k: v for k, v in pods[name].items() if k.endswith("_ALLOW")} == expected, name


def test_tracing_gives_the_relays_the_standard_otel_variables() -> None:
    def relay_env(values: dict[str, Any]) -> list[dict[str, Any]]:
        [relay] = [
            d
            for d in by_kind(documents(render(values)), "Deployment")
            if d["metadata"]["name"].endswith("outbox-relay")
        ]
        env: list[dict[str, Any]] = relay["spec"]["template"]["spec"]["containers"][0]["env"]
        return env

    env = relay_env(VALUE_SETS["tracing"])
    names = [e["name"] for e in env]
    values = {e["name"]: e.get("value") for e in env}

    assert values["OTEL_TRACES_EXPORTER"] == "otlp"
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert values["OTEL_SERVICE_NAME"] == "outbox-outbox-relay"
    assert values["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert values["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
    assert values["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.namespace.name=prod,k8s.pod.name=$(POD_NAME)"
    # $(POD_NAME) expands only to a variable listed before it.
    assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert not [e for e in relay_env({}) if e["name"].startswith("OTEL_")]


def _hook(doc: dict[str, Any]) -> tuple[set[str], int] | None:
    notes = doc["metadata"].get("annotations") or {}
    if "helm.sh/hook" not in notes:
        return None
    return set(notes["helm.sh/hook"].split(",")), int(notes.get("helm.sh/hook-weight", "0"))


def _references(pod: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of what a pod spec needs to exist before it can start."""
    refs = {("ServiceAccount", pod.get("serviceAccountName", "default"))}
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            refs.add(("ConfigMap", volume["configMap"]["name"]))
        if "secret" in volume:
            refs.add(("Secret", volume["secret"]["secretName"]))
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        for env in c.get("env", []):
            source = env.get("valueFrom", {})
            if "configMapKeyRef" in source:
                refs.add(("ConfigMap", source["configMapKeyRef"]["name"]))
            if "secretKeyRef" in source:
                refs.add(("Secret", source["secretKeyRef"]["name"]))
    return refs


def test_hooks_use_only_what_exists_before_they_run(rendered: list[dict[str, Any]]) -> None:
    ordinary = {(d["kind"], d["metadata"]["name"]) for d in rendered if _hook(d) is None}
    hooks = {(d["kind"], d["metadata"]["name"]): _hook(d) for d in rendered if _hook(d)}
    for doc in rendered:
        found = _hook(doc)
        if found is None or doc["kind"] not in ("Job", "Pod"):
            continue
        phases, weight = found
        pod = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc["spec"]
        for ref in _references(pod):
            assert ref not in ordinary, f"{doc['metadata']['name']} needs {ref}, made after hooks"
            if ref in hooks:
                their_phases, their_weight = hooks[ref]  # type: ignore[misc]
                assert phases <= their_phases, (ref, "not created in every phase of the hook")
                assert their_weight < weight, (ref, "created after the hook that needs it")


def test_one_relay_gets_no_disruption_budget_that_would_block_drains() -> None:
    def budgets(values: dict[str, Any]) -> list[dict[str, Any]]:
        return by_kind(documents(render(values)), "PodDisruptionBudget")

    assert budgets({"relay": {"replicas": 1}}) == []
    [budget] = budgets({"relay": {"replicas": 2}})
    assert budget["spec"]["maxUnavailable"] == 1
    assert budgets({"relay": {"replicas": 1, "autoscaling": {"enabled": True}}}) != []


def test_extra_volumes_and_identity_reach_relays_migrations_and_controller() -> None:
    mount = {"name": "ca", "mountPath": "/etc/outbox/ca", "readOnly": True}
    volume = {"name": "ca", "secret": {"secretName": "smtp-ca"}}
    identity = {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/outbox"}
    extra = {"extraVolumes": [volume], "extraVolumeMounts": [mount]}
    values = {
        "relay": {**extra, "serviceAccount": {"annotations": identity}},
        "controller": {**extra, "extraEnv": [{"name": "A", "value": "b"}]},
    }
    docs = documents(render(values))

    for name, pod, c in containers(docs):
        assert volume in pod["volumes"], name
        assert mount in c["volumeMounts"], name
    accounts = {d["metadata"]["name"]: d for d in by_kind(docs, "ServiceAccount")}
    for suffix in ("relay", "migrate"):
        notes = accounts[f"outbox-outbox-relay-{suffix}"]["metadata"]["annotations"]
        assert notes["eks.amazonaws.com/role-arn"] == identity["eks.amazonaws.com/role-arn"]


def test_one_controller_at_a_time_with_a_release_scoped_peering() -> None:
    def controller(values: dict[str, Any], name: str = "outbox", ns: str = "prod") -> Any:
        docs = documents(render(values, name=name, namespace=ns))
        [deploy] = [
            d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-controller")
        ]
        env = {
            e["name"]: e.get("value")
            for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        peerings = [d for d in docs if d["kind"] in ("KopfPeering", "ClusterKopfPeering")]
        return deploy, env["OUTBOX_CONTROLLER_PEERING"], [p["metadata"]["name"] for p in peerings]

    deploy, peering, objects = controller({})
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    assert objects == [peering] == ["prod-outbox-outbox-relay"]
    wide = {"controller": {"watchAllNamespaces": True}}
    assert controller(wide, "a", "ns1")[1] != controller(wide, "b", "ns1")[1]
    assert controller(wide, "a", "ns1")[1] != controller(wide, "a", "ns2")[1]
    with pytest.raises(helm_python.HelmValuesError):
        render({"controller": {"replicas": 2}})


def test_the_dashboard_is_valid_grafana_json_whose_queries_promtool_accepts(
    tmp_path: Path,
) -> None:
    [config] = by_kind(
        documents(render({"monitoring": {"grafanaDashboard": {"enabled": True}}})), "ConfigMap"
    )
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["outbox-relay.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    wanted = ("outbox_delivered_total", "outbox_buried_messages", "outbox_lease_lost_total")
    assert all(any(name in e for e in exprs) for name in wanted)
    assert any("outbox_database_up" in e for e in exprs)
    promtool = require("promtool", "prometheus")
    rules = [
        {"record": f"outbox:panel_{i}", "expr": e.replace("$namespace", ".*").replace("$job", ".*")}
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "panels.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "p", "rules": rules}]})
    )
    result = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "panels.yaml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_keda_scales_on_the_backlog_instead_of_cpu() -> None:
    keda = {"enabled": True, "serverAddress": "http://prometheus:9090", "pendingPerReplica": 500}
    docs = documents(render({"relay": {"autoscaling": {"enabled": True, "keda": keda}}}))

    [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
    assert by_kind(docs, "HorizontalPodAutoscaler") == [], "KEDA owns the HPA"
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["metadata"]["threshold"] == "500"
    assert 'job="outbox-outbox-relay-metrics", namespace="prod"' in trigger["metadata"]["query"]
    relay = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "outbox-outbox-relay"
    )
    assert "replicas" not in relay["spec"]
    with pytest.raises(helm_python.HelmError, match="serverAddress"):
        render({"relay": {"autoscaling": {"keda": {"enabled": True}}}})


def test_keda_reads_the_backlog_once_however_many_relays_export_it(tmp_path: Path) -> None:
    keda = {"enabled": True, "serverAddress": "http://prometheus:9090", "pendingPerReplica": 500}
    docs = documents(render({"relay": {"autoscaling": {"keda": keda}}}))
    [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    promtool = require("promtool", "prometheus")
    rules = {"groups": [{"name": "keda", "rules": [{"record": "keda:backlog", "expr": query}]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    job = 'job="outbox-outbox-relay-metrics", namespace="prod"'
    series = [  # three relays export the same shared count of two topics
        {"series": f'outbox_pending_messages{{{job}, pod="{pod}", topic="{topic}"}}', "values": n}
        for pod in ("r1", "r2", "r3")
        for topic, n in (("mail.a", "120x5"), ("mail.b", "30x5"))
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "keda:backlog",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "keda:backlog", "value": 150}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_network_policy_opens_only_ports_the_pods_declare() -> None:
    docs = documents(render({"networkPolicy": {"enabled": True}}))
    [policy] = by_kind(docs, "NetworkPolicy")
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    selected = policy["spec"]["podSelector"]["matchLabels"]

    for deploy in by_kind(docs, "Deployment"):
        template = deploy["spec"]["template"]
        assert selected.items() <= template["metadata"]["labels"].items(), "a pod left out"
        declared = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert declared <= ports | {"http-health"}, deploy["metadata"]["name"]
    assert ports == {"http-metrics", "http-health"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_the_egress_policy_lets_relays_reach_only_what_is_listed() -> None:
    values = {
        "networkPolicy": {
            "egress": {
                "enabled": True,
                "cidrs": [{"cidr": "10.0.5.0/24", "ports": [5432]}, {"cidr": "0.0.0.0/0"}],
            }
        }
    }
    docs = documents(render(values))
    [policy] = by_kind(docs, "NetworkPolicy")
    kubernetes_validate.validate(policy, "1.31.0", strict=True)
    [relay] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-relay")]
    rules = policy["spec"]["egress"]

    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        relay["spec"]["template"]["metadata"]["labels"].items()
    )
    assert [p["port"] for p in rules[0]["ports"]] == [53, 53]
    assert rules[1] == {
        "to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}],
        "ports": [{"port": 5432, "protocol": "TCP"}],
    }
    assert rules[2] == {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}]}
    assert by_kind(documents(render({})), "NetworkPolicy") == []


def test_secret_names_and_keys_are_quoted() -> None:
    values = {
        "smtp": {
            "enabled": True,
            "host": "mail",
            "existingSecret": "smtp",
            "usernameKey": "u\n optional: true",
        },
    }
    docs = documents(render(values))
    refs = [
        env["valueFrom"]["secretKeyRef"]
        for _, _, container in containers(docs)
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    ]

    assert {"name": "smtp", "key": "u\n optional: true"} in refs
    assert all("optional" not in ref for ref in refs)


def test_the_controller_grants_the_release_its_default_topics_and_the_listed_ones() -> None:
    values = {
        "controller": {
            "grants": [
                {"namespace": "billing", "topics": "billing.*"},
                {"topics": "orders.placed", "reroute": True},
            ]
        }
    }
    docs = documents(render(values))
    [controller] = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-controller")
    ]
    env = {
        e["name"]: e.get("value")
        for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]
    }

    assert env["OUTBOX_CONTROLLER_GRANTS"] == (
        "prod=mail.login_link,prod=mail.email_change,billing=billing.*,prod=orders.placed:reroute"
    )


def test_the_migrate_hook_can_use_an_owner_role_of_its_own() -> None:
    values = {"migrations": {"existingSecret": "outbox-owner", "secretKey": "dsn"}}
    docs = documents(render(values))
    [job] = by_kind(docs, "Job")
    relay = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-relay"))

    def database(workload: dict[str, Any]) -> dict[str, str]:
        env = workload["spec"]["template"]["spec"]["containers"][0]["env"]
        [url] = [e for e in env if e["name"] == "OUTBOX_DATABASE_URL"]
        ref: dict[str, str] = url["valueFrom"]["secretKeyRef"]
        return ref

    assert database(job) == {"name": "outbox-owner", "key": "dsn"}
    assert database(relay) == {"name": "outbox-outbox-relay-database", "key": "url"}
