"""The chart's wiring, rendered by the real Helm SDK: which values reach which pods
(settings, allow lists, tracing, volumes, identities), hooks that use only what
exists before they run, scaling, network policies, the controller's grants.

What this cannot prove without a cluster is listed in test_chart.py.
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

from outbox.service.settings import (
    KIND_SETTINGS,
    RelaySettings,
    ServiceSettings,
    SmtpSettings,
    variables,
)
from tests.chart.values import VALUE_SETS, by_kind, containers
from tests.tools import require
from tools.manifests import documents, render


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
