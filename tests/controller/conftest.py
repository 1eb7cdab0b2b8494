"""The real kopf operator, in its own thread, against kmock's Kubernetes emulator."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import kmock
import kopf
import pytest

from outbox.controller import ControllerConfig, build_registry, operator_settings
from outbox.postgres import PostgresStore, migrate

NS = "ns1"
RES = kmock.resource("outbox.dev", "v1alpha1", "outboxtopics")
LEASE = dt.timedelta(minutes=2)


@pytest.fixture
async def k8s() -> AsyncIterator[kmock.KubernetesEmulator]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources.load_bundled()
        emulator.resources[RES] = kmock.ResourceInfo(
            kind="OutboxTopic",
            namespaced=True,
            subresources={"status"},
            verbs={"get", "list", "watch", "patch", "create", "delete", "update"},
        )
        yield emulator


async def eventually(
    what: str, check: Callable[[], Awaitable[bool] | bool], within: float = 10
) -> None:
    """Wait for the operator thread to get there."""
    with anyio.fail_after(within):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await anyio.sleep(0.05)


class Cluster:
    """Talks to the emulator as kubectl would, and reads back what the operator did."""

    def __init__(self, k8s: kmock.KubernetesEmulator, store: PostgresStore) -> None:
        self.k8s = k8s
        self.store = store

    def url(self, name: str = "") -> str:
        base = f"/apis/outbox.dev/v1alpha1/namespaces/{NS}/outboxtopics"
        return f"{base}/{name}" if name else base

    async def create(self, name: str, created: dt.datetime | None = None, **spec: Any) -> None:
        """POST an OutboxTopic; ``created`` stands for the API server's creationTimestamp."""
        stamp = (created or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "outbox.dev/v1alpha1",
            "kind": "OutboxTopic",
            "metadata": {
                "name": name,
                "namespace": NS,
                "uid": f"uid-{name}",
                "generation": 1,
                # kopf guards some patches with a JSON-patch test of it.
                "resourceVersion": "1",
                "creationTimestamp": stamp,
            },
            "spec": spec,
        }
        response = await self.k8s.post(self.url(), json=body)
        assert response.status < 300, await response.text()

    async def edit(self, name: str, **spec: Any) -> None:
        generation = int(self.obj(name)["metadata"].get("generation", 1)) + 1
        response = await self.k8s.patch(
            self.url(name),
            json={"metadata": {"generation": generation}, "spec": spec},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status < 300, await response.text()

    async def delete(self, name: str) -> None:
        response = await self.k8s.delete(self.url(name))
        assert response.status < 300, await response.text()

    def obj(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.k8s.objects[RES, NS, name].raw
        return found

    def gone(self, name: str) -> bool:
        return (RES, NS, name) not in self.k8s.objects or self.k8s.objects[RES, NS, name].deleted

    def condition(self, name: str, kind: str = "Ready") -> dict[str, Any] | None:
        for c in self.obj(name).get("status", {}).get("conditions", []):
            if c["type"] == kind:
                return dict(c)
        return None


@asynccontextmanager
async def operator(
    k8s: kmock.KubernetesEmulator,
    conninfo: str,
    *,
    peering: str | None = None,
    priority: int = 0,
    seen: list[str] | None = None,
    name: str = "kopf",
    kinds: dict[str, Any] | None = None,
) -> AsyncIterator[None]:
    """A real kopf operator over ``conninfo``, in a thread of its own, until the block ends.

    With ``seen``, every reconcile it runs appends ``name`` (who acted).
    """
    config = ControllerConfig(conninfo=conninfo, lease=LEASE, status_interval=0.3)
    if kinds is not None:
        config.kinds = kinds
    registry = build_registry(config)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(k8s.url))

    if seen is not None:

        @kopf.timer("outbox.dev", "v1alpha1", "outboxtopics", registry=registry, interval=0.2)
        def acted(**_: Any) -> None:
            seen.append(name)

    settings = operator_settings(events=True)
    settings.peering.lifetime = 5
    stop, ready = threading.Event(), threading.Event()
    cleaned: list[asyncio.Event] = []  # made in kopf's loop

    @kopf.on.cleanup(registry=registry)
    async def last(**_: Any) -> None:
        cleaned[0].set()

    async def exit_at_cleanup() -> None:
        cleaned.append(asyncio.Event())
        op = asyncio.ensure_future(
            kopf.operator(
                registry=registry,
                settings=settings,
                standalone=peering is None,
                peering_name=peering,
                priority=priority,
                namespaces=[NS],
                stop_flag=stop,
                ready_flag=ready,
            )
        )
        # Stopping, kopf gives the timers that late watch events spawned 5 s
        # to end by themselves (ours never do: a timer repeats); once its
        # cleanup ran nothing of the operator is left to wait for.
        done = asyncio.ensure_future(cleaned[0].wait())
        await asyncio.wait({op, done}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(op, 0.2)

    def operate() -> None:
        # kopf gets a loop of its own: in the test's loop its exit would cancel
        # the test framework's tasks.
        asyncio.run(exit_at_cleanup())

    thread = threading.Thread(target=operate, name=name, daemon=True)
    thread.start()
    assert await anyio.to_thread.run_sync(ready.wait, 15), "the operator did not start"
    try:
        yield
    finally:
        stop.set()
        await anyio.to_thread.run_sync(thread.join, 30)
        assert not thread.is_alive(), "the operator did not stop"
        # kopf's loop ends with keep-alive connections to the emulator still in
        # its client's pool; collect them now, quietly, not at some later test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture
async def cluster(
    k8s: kmock.KubernetesEmulator, pg_store: PostgresStore, pg_conninfo: str
) -> AsyncIterator[Cluster]:
    await migrate(pg_conninfo)
    async with operator(k8s, pg_conninfo):
        yield Cluster(k8s, pg_store)
