"""Who governs a topic, what status says over time, and how many controllers act."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import anyio
import kmock

from outbox.handlers import HandlerKinds
from outbox.handlers.mail import LOGIN_LINK
from outbox.postgres import PostgresStore, connect_pool, migrate
from outbox.service.embedded import EmbeddedPostgres
from outbox.service.settings import WebhookSettings
from tests.controller.conftest import NS, RES, Cluster, eventually, operator


async def test_back_to_back_creations_the_older_resource_wins(cluster: Cluster) -> None:
    now = dt.datetime.now(dt.UTC)
    # The newer resource reaches the controller first.
    await cluster.create("newer", created=now, topic="orders.placed", handler="log")
    await cluster.create(
        "older", created=now - dt.timedelta(hours=1), topic="orders.placed", handler="log"
    )

    await eventually(
        "a Conflict for the newer", lambda: cluster.condition("newer", "Conflict") is not None
    )
    await eventually(
        "the older Ready", lambda: (cluster.condition("older") or {}).get("status") == "True"
    )
    entry = (await cluster.store.topics())["orders.placed"]
    assert entry.source == "kubernetes:ns1/older"
    assert (
        "governed by OutboxTopic ns1/older"
        in (cluster.condition("newer", "Conflict") or {})["message"]
    )


async def test_transition_times_hold_between_ticks_and_a_problem_warns_once(
    cluster: Cluster,
) -> None:
    await cluster.create("slow", topic=LOGIN_LINK, timeout="5m", enabled=False)
    await eventually("Invalid", lambda: cluster.condition("slow", "Invalid") is not None)
    # The creation's reconcile and the first status tick may race before any
    # status exists; from the first tick on, the time must hold.
    await _ticks(cluster, "slow", 1)
    first = cluster.condition("slow")

    seen = await _ticks(cluster, "slow", 4)

    assert (cluster.condition("slow") or {})["lastTransitionTime"] == (first or {})[
        "lastTransitionTime"
    ]
    warnings = [
        r for r in cluster.k8s if r.url.path.endswith("/events") and "Warning" in str(r.data)
    ]
    assert len(warnings) == 1, f"{len(warnings)} Warnings over {seen} status ticks"
    status = cluster.obj("slow")["status"]
    assert status["enabled"] is True, "no entry was applied: relays deliver with the defaults"

    await cluster.edit("slow", timeout="10s")
    await eventually("Ready", lambda: (cluster.condition("slow") or {}).get("status") == "True")
    assert (cluster.condition("slow") or {})["lastTransitionTime"] >= (first or {})[
        "lastTransitionTime"
    ]
    assert cluster.obj("slow")["status"]["enabled"] is False


async def _ticks(cluster: Cluster, name: str, n: int) -> int:
    """Wait until the status timer has patched ``name`` ``n`` more times."""

    def patches() -> int:
        return len(
            [
                r
                for r in cluster.k8s
                if r.method == "PATCH" and r.url.path.endswith(f"/{name}/status")
            ]
        )

    start = patches()
    await eventually(f"{n} status ticks", lambda: patches() >= start + n)
    return patches() - start


async def test_a_database_outage_makes_ready_unknown_and_it_recovers(
    k8s: kmock.KubernetesEmulator, tmp_path: Path
) -> None:
    await anyio.to_thread.run_sync(tmp_path.chmod, 0o755)  # the server runs as its own user
    server = EmbeddedPostgres(tmp_path / "pgdata")
    url = server.start()
    try:
        await migrate(url)
        async with connect_pool(url, max_size=2) as pool, operator(k8s, url):
            cluster = Cluster(k8s, PostgresStore(pool))
            await cluster.create("orders", topic="orders.placed", handler="log")
            await eventually(
                "Ready", lambda: (cluster.condition("orders") or {}).get("status") == "True"
            )

            server.stop()
            await eventually(
                "Ready Unknown",
                lambda: (cluster.condition("orders") or {}).get("status") == "Unknown",
                within=30,
            )
            ready = cluster.condition("orders") or {}
            assert ready["reason"] == "DatabaseUnavailable"
            assert "cannot read the topic registry" in ready["message"]

            assert server.start() == url
            await eventually(
                "Ready again",
                lambda: (cluster.condition("orders") or {}).get("status") == "True",
                within=30,
            )
    finally:
        server.stop()


async def test_of_two_peered_operators_exactly_one_acts(
    k8s: kmock.KubernetesEmulator, pg_conninfo: str, pg_store: PostgresStore
) -> None:
    peerings = kmock.resource("kopf.dev", "v1", "kopfpeerings")
    k8s.resources[peerings] = kmock.ResourceInfo(
        kind="KopfPeering",
        namespaced=True,
        verbs={"get", "list", "watch", "patch", "create"},
    )
    await k8s.post(
        f"/apis/kopf.dev/v1/namespaces/{NS}/kopfpeerings",
        json={
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": "release", "namespace": NS},
        },
    )
    await migrate(pg_conninfo)
    cluster = Cluster(k8s, pg_store)
    seen: list[str] = []
    async with operator(k8s, pg_conninfo, peering="release", priority=100, seen=seen, name="hi"):
        async with operator(k8s, pg_conninfo, peering="release", priority=10, seen=seen, name="lo"):
            await cluster.create("orders", topic="orders.placed", handler="log")
            await eventually("the high one to act", lambda: seen.count("hi") >= 5, within=20)
            assert "lo" not in seen[-3:]
            marker = len(seen)
            await eventually("more ticks", lambda: len(seen) >= marker + 5)
            assert set(seen[marker:]) == {"hi"}, "both operators acted at once"
        del seen[:]
        await eventually("the high one alone", lambda: len(seen) >= 3)
        assert set(seen) == {"hi"}
    assert (RES, NS, "orders") in k8s.objects


async def test_a_webhook_outside_the_allowlist_is_invalid(
    k8s: kmock.KubernetesEmulator, pg_conninfo: str, pg_store: PostgresStore
) -> None:
    await migrate(pg_conninfo)
    kinds = HandlerKinds(webhook=WebhookSettings(allow="https://billing.internal/")).mapping
    async with operator(k8s, pg_conninfo, kinds=kinds):
        cluster = Cluster(k8s, pg_store)
        await cluster.create(
            "steal",
            topic=LOGIN_LINK,
            handler="webhook",
            webhook={"url": "https://attacker.example/collect"},
        )
        await eventually("Invalid", lambda: cluster.condition("steal", "Invalid") is not None)
        invalid = cluster.condition("steal", "Invalid") or {}

    assert "not under OUTBOX_WEBHOOK_ALLOW" in invalid["message"]
    assert await pg_store.topics() == {}


async def test_deleting_without_a_controller_leaves_nothing_stuck_and_the_entry_is_pruned(
    k8s: kmock.KubernetesEmulator, pg_conninfo: str, pg_store: PostgresStore
) -> None:
    await migrate(pg_conninfo)
    cluster = Cluster(k8s, pg_store)
    async with operator(k8s, pg_conninfo):
        await cluster.create("orders", topic="orders.placed", handler="log", enabled=False)
        await cluster.create("other", topic="orders.shipped", handler="log")
        await eventually("both entries", lambda: _entries(pg_store, 2))
    assert not cluster.obj("orders")["metadata"].get("finalizers"), "no finalizer to wait on"

    await cluster.delete("orders")  # helm uninstall: the controller is gone already
    assert cluster.gone("orders"), "stuck Terminating"

    async with operator(k8s, pg_conninfo):
        await eventually("the orphan entry pruned", lambda: _entries(pg_store, 1))
    assert set(await pg_store.topics()) == {"orders.shipped"}


async def _entries(store: PostgresStore, n: int) -> bool:
    return len(await store.topics()) == n


# -- who may govern what (grants) ---------------------------------------------------


async def _reconcile(store: PostgresStore, namespace: str, spec: dict[str, Any], **kw: Any) -> Any:
    from outbox.controller.handlers import BUILTIN_TOPICS
    from outbox.controller.reconcile import reconcile

    kinds = HandlerKinds(webhook=WebhookSettings(allow="https://attacker.example/")).mapping
    return await reconcile(
        store,
        spec,
        source=f"kubernetes:{namespace}/r-{spec['topic']}",
        generation=1,
        now=dt.datetime.now(dt.UTC),
        lease=dt.timedelta(minutes=2),
        builtin_topics=BUILTIN_TOPICS,
        kinds=kinds,
        **kw,
    )


def _message(outcome: object) -> str:
    return str(outcome.status["conditions"][0]["message"])  # type: ignore[attr-defined]


async def test_without_grants_no_resource_reroutes_a_built_in_or_application_topic(
    pg_conninfo: str, pg_store: PostgresStore
) -> None:
    from outbox.store import RelayInfo

    await migrate(pg_conninfo)
    relay = RelayInfo(uuid.uuid4(), "pod-a", 7, "0.1.0", ("orders.placed",), ("log",))
    await pg_store.register_relay(relay, dt.timedelta(minutes=1))
    steal = {"handler": "webhook", "webhook": {"url": "https://attacker.example/collect"}}

    # The sleeper: the chart's mail-login-link resource is gone, the tenant's is the oldest.
    sleeper = await _reconcile(pg_store, "tenant-b", {"topic": LOGIN_LINK, **steal})
    app = await _reconcile(pg_store, "tenant-b", {"topic": "orders.placed", **steal})
    own = await _reconcile(pg_store, "tenant-b", {"topic": "tenant.events", **steal})

    assert not sleeper.ready
    assert "has a built-in or application handler" in _message(sleeper)
    assert not app.ready
    assert "needs a grant with :reroute" in _message(app)
    assert own.ready  # a topic no handler serves: a kind is its only way out
    assert set(await pg_store.topics()) == {"tenant.events"}


async def test_a_reroute_applied_before_any_relay_served_the_topic_is_withdrawn_once_one_does(
    pg_conninfo: str, pg_store: PostgresStore
) -> None:
    from outbox.store import RelayInfo

    await migrate(pg_conninfo)
    steal = {"topic": "orders.placed", "handler": "webhook"}
    steal["webhook"] = {"url": "https://attacker.example/collect"}  # type: ignore[assignment]

    # A fresh install: no relay has said it serves orders.placed yet.
    early = await _reconcile(pg_store, "tenant-b", steal)
    assert early.ready
    entry = (await pg_store.topics())["orders.placed"]
    assert (entry.handler, entry.reroute) == ("webhook", False)  # relays keep their own

    # The application's relay starts: it serves the topic through the webhook
    # entry (listed in topics), but says it has a handler of its own.
    relay = RelayInfo(
        uuid.uuid4(), "pod-a", 7, "0.2.0", ("orders.placed",), ("webhook",),
        handlers=("orders.placed",),
    )  # fmt: skip
    await pg_store.register_relay(relay, dt.timedelta(minutes=1))
    later = await _reconcile(pg_store, "tenant-b", steal)

    assert not later.ready
    assert [c["type"] for c in later.status["conditions"]] == ["Ready", "Invalid"]
    assert "has a built-in or application handler" in _message(later)
    assert "orders.placed" not in await pg_store.topics(), "the entry is withdrawn"


async def test_a_granted_reroute_is_recorded_on_the_entry(
    pg_conninfo: str, pg_store: PostgresStore
) -> None:
    from outbox.controller.grants import parse_grants

    await migrate(pg_conninfo)
    grants = parse_grants("billing=orders.*:reroute, shop=orders.placed")
    spec = {"topic": "orders.placed", "handler": "log"}

    assert (await _reconcile(pg_store, "billing", spec, grants=grants)).ready
    assert (await pg_store.topics())["orders.placed"].reroute


async def test_with_grants_a_namespace_governs_only_its_granted_topics(
    pg_conninfo: str, pg_store: PostgresStore
) -> None:
    from outbox.controller.grants import parse_grants

    await migrate(pg_conninfo)
    grants = parse_grants(
        "outbox=mail.login_link, billing=billing.*, billing=mail.email_change:reroute"
    )
    steal = {"handler": "webhook", "webhook": {"url": "https://attacker.example/collect"}}

    chart = await _reconcile(pg_store, "outbox", {"topic": LOGIN_LINK}, grants=grants)
    tenant = await _reconcile(
        pg_store, "tenant-b", {"topic": "billing.paid", **steal}, grants=grants
    )
    billing = await _reconcile(
        pg_store, "billing", {"topic": "billing.paid", **steal}, grants=grants
    )
    reroute = await _reconcile(
        pg_store, "billing", {"topic": "mail.email_change", **steal}, grants=grants
    )

    assert chart.ready
    assert not tenant.ready
    assert "namespace tenant-b is not granted topic billing.paid" in _message(tenant)
    assert billing.ready
    assert reroute.ready
    assert set(await pg_store.topics()) == {LOGIN_LINK, "billing.paid", "mail.email_change"}


async def test_an_operators_entry_is_a_conflict_not_silently_replaced(
    pg_conninfo: str, pg_store: PostgresStore
) -> None:
    from outbox.store import TopicSettings

    await migrate(pg_conninfo)
    await pg_store.set_topic(TopicSettings("orders.placed", enabled=False, source="cli"))

    outcome = await _reconcile(pg_store, "ns1", {"topic": "orders.placed", "handler": "log"})

    assert not outcome.ready
    assert "written by `outbox topics` (cli)" in _message(outcome)
    entry = (await pg_store.topics())["orders.placed"]
    assert (entry.source, entry.enabled) == ("cli", False)


def test_grants_that_do_not_parse_are_refused() -> None:
    import pytest

    from outbox.controller.grants import parse_grants

    for bad in ("outbox", "Outbox=mail.*", "outbox=mail.*:steal", "outbox=Mail"):
        with pytest.raises(ValueError, match=r"outbox|Outbox"):
            parse_grants(bad)
    assert str(parse_grants("*=orders.*:reroute").items[0]) == "*=orders.*:reroute"
