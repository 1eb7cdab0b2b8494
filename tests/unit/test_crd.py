"""The OutboxTopic CRD's schema: the examples pass, bad specs are refused at admission.

Validated with a JSON-schema validator over the openAPIV3Schema the CRD file
declares (the Kubernetes extensions, like nullable, are mapped to JSON schema).
Pruning of unknown fields and defaulting are the API server's work and are not
exercised here.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "k8s"
CRD = yaml.safe_load((K8S / "crds" / "outboxtopics.outbox.dev.yaml").read_text())


def _json_schema(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if node.pop("nullable", False):
            node["type"] = [node["type"], "null"]
        return node
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    return node


SCHEMA = _json_schema(CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def valid(obj: dict[str, Any]) -> bool:
    return bool(jsonschema.Draft7Validator(SCHEMA).is_valid(obj))


EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path: Path) -> None:
    example = yaml.safe_load(path.read_text())

    assert example["kind"] == CRD["spec"]["names"]["kind"]
    assert valid(example), list(jsonschema.Draft7Validator(SCHEMA).iter_errors(example))


BASE = {"spec": {"topic": "mail.login_link"}}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"spec": {}}, "topic is required"),
        ({"spec": {"topic": ""}}, "empty topic"),
        ({"spec": {"topic": "Mail.Login"}}, "upper case"),
        ({"spec": {"topic": "a" * 201}}, "too long"),
        ({"spec": {"topic": "a", "enabled": "yes"}}, "enabled is a boolean"),
        ({"spec": {"topic": "a", "maxAttempts": 0}}, "maxAttempts below 1"),
        ({"spec": {"topic": "a", "maxAttempts": 5000}}, "maxAttempts above 1000"),
        ({"spec": {"topic": "a", "maxInFlight": 0}}, "maxInFlight below 1"),
        ({"spec": {"topic": "a", "timeout": "30"}}, "timeout without a unit"),
        ({"spec": {"topic": "a", "timeout": "-5s"}}, "negative timeout"),
        ({"spec": {"topic": "a", "handler": "Web Hook"}}, "handler name"),
        ({"spec": {"topic": "a", "config": "url=x"}}, "config is an object"),
        ({"spec": {"topic": "a", "ordering": {"onBuried": "never"}}}, "onBuried block or skip"),
        ({"spec": None}, "spec is required"),
    ],
)
def test_bad_specs_are_refused(change: dict[str, Any], why: str) -> None:
    obj = copy.deepcopy(BASE)
    obj.update(change)
    obj = {k: v for k, v in obj.items() if v is not None}

    assert not valid(obj), why


def test_printer_columns_show_what_sres_look_for() -> None:
    columns = [c["name"] for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]]

    assert columns == [
        "Topic",
        "Handler",
        "Enabled",
        "Relays",
        "Pending",
        "Buried",
        "Blocked",
        "Oldest",
        "Ready",
        "Reason",
        "Age",
    ]
    enabled = CRD["spec"]["versions"][0]["additionalPrinterColumns"][2]
    assert enabled["jsonPath"] == ".status.enabled", "what relays apply, not the spec"
    assert CRD["spec"]["names"]["shortNames"] == ["obt"]
    assert CRD["spec"]["versions"][0]["subresources"] == {"status": {}}


def _rules(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any, str]]:
    """(schema path, schema node, rule) of every x-kubernetes-validations rule."""
    found = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, node, rule["rule"]))
        for key, child in node.get("properties", {}).items():
            found.extend(_rules(child, (*path, key)))
    return found


RAW_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_every_cel_rule_reads_only_declared_properties() -> None:
    # The API server types only declared properties; a rule that reads any
    # other field does not compile and the whole CRD is refused. No API server
    # runs here, so this is checked statically.
    rules = _rules(RAW_SCHEMA)
    assert len(rules) >= 5
    for path, node, rule in rules:
        for chain in re.findall(r"\b(?:self|oldSelf)((?:\.[A-Za-z_]\w*)+)", rule):
            here = node
            for name in chain.strip(".").split("."):
                declared = here.get("properties", {})
                assert name in declared, f"{'.'.join(path)}: {rule!r} reads undeclared {name!r}"
                here = declared[name]


def test_the_topic_of_a_resource_cannot_change() -> None:
    topic = RAW_SCHEMA["properties"]["spec"]["properties"]["topic"]

    assert {"rule": "self == oldSelf", "message": ANY_TEXT} in [
        {**r, "message": ANY_TEXT} for r in topic["x-kubernetes-validations"]
    ]


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_TEXT: Any = _Any()


def test_ordering_reaches_the_registry_entry() -> None:
    import datetime as dt

    from outbox.controller.reconcile import InvalidSpec, desired
    from outbox.handlers import HandlerKinds

    def entry(spec: dict[str, Any]) -> Any:
        base = {"topic": "orders.events", "handler": "log"}
        kinds = HandlerKinds().mapping
        return desired(
            {**base, **spec}, lease=dt.timedelta(minutes=2), builtin_topics=frozenset(),
            kinds=kinds,
        )  # fmt: skip

    assert entry({"ordering": {"onBuried": "skip"}}).on_buried == "skip"
    assert entry({"ordering": {"onBuried": "block"}}).on_buried is None
    assert entry({}).on_buried is None
    with pytest.raises(InvalidSpec, match="onBuried"):
        entry({"ordering": {"onBuried": "sometimes"}})


def test_cloud_events_reach_the_config_of_the_kinds_that_send_them() -> None:
    import datetime as dt

    from outbox.controller.reconcile import InvalidSpec, desired
    from outbox.handlers import HandlerKinds

    def entry(spec: dict[str, Any]) -> Any:
        return desired(
            {"topic": "orders.events", **spec}, lease=dt.timedelta(minutes=2),
            builtin_topics=frozenset(), kinds=HandlerKinds().mapping,
        )  # fmt: skip

    nats = {"handler": "nats", "nats": {"subject": "orders.events"}}
    assert entry({**nats, "cloudEvents": True}).config == {
        "subject": "orders.events",
        "cloud_events": True,
    }
    assert entry({**nats, "cloudEvents": False}).config == {"subject": "orders.events"}
    amqp = {"handler": "amqp", "amqp": {"exchange": "orders"}, "cloudEvents": True}
    assert entry(amqp).config == {"exchange": "orders", "cloud_events": True}
    for handler in ({"handler": "log"}, {"handler": "redis", "redis": {"stream": "o"}}, {}):
        with pytest.raises(InvalidSpec, match=r"spec\.cloudEvents goes with handler nats, webhook"):
            entry({**handler, "cloudEvents": True})
