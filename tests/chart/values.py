"""The value sets the chart tests render, and what they look up in the result."""

from __future__ import annotations

from typing import Any

import yaml

from tools.manifests import CHART

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
    "console": {
        "ui": {
            "enabled": True,
            "database": {"existingSecret": "outbox-console-db"},
            "auth": {"tokensSecret": "outbox-ui-tokens", "sessionSecret": "outbox-ui-session"},
            "basePath": "/outbox",
            "prometheusUrl": "http://prometheus-operated.monitoring:9090",
            "traceUrl": "https://tempo.example/trace/{trace_id}",
            "ingress": {
                "enabled": True,
                "className": "nginx",
                "host": "ops.example.com",
                "tls": [{"secretName": "ops-tls", "hosts": ["ops.example.com"]}],
            },
            "networkPolicy": {
                "from": [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}]
            },
        }
    },
    "console behind a proxy": {
        "ui": {
            "enabled": True,
            "auth": {
                "proxy": {
                    "addresses": ["10.0.0.0/8"],
                    "operatorGroups": ["sre"],
                    "viewerGroups": ["dev"],
                }
            },
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
