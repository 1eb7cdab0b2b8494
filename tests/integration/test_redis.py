"""The redis handler kind against real Redis servers: the CI's, and one of the test's
own where the server must restart."""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from outbox import Store, backoff, new_message
from outbox.errors import ConfigError
from outbox.handlers import HandlerKinds
from outbox.handlers.streams import KIND, RedisConfig
from outbox.memory import MemoryStore
from outbox.service.settings import RedisSettings
from outbox.settings import load
from tests.integration.kinds import TOPIC, KindRelay
from tests.integration.process import LocalServer
from tests.tools import require, require_service

CI_REDIS = "redis://127.0.0.1:6379/0"


class RedisServer(LocalServer):
    """A redis-server of the test's own on a loopback port, keeping nothing on disk."""

    name = "redis-server"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [require("redis-server", "redis-server"), "--port", str(self.port),
                "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.folder)]  # fmt: skip


class Appender(KindRelay):
    def __init__(self, store: Store[Any], url: str, **config: Any) -> None:
        settings = RedisSettings.model_validate({"url": url, "timeout": "1s"})
        super().__init__(store, {"order": 7}, redis=settings, **config)

    async def bind(self, stream: str, **extra: Any) -> None:
        await self.bind_kind("redis", {"stream": stream, **extra})


@pytest.fixture
async def stream() -> AsyncIterator[str]:
    """A stream name of this test's own on the CI's Redis, deleted afterwards."""
    require_service("127.0.0.1", 6379, "Redis")
    name = f"outbox-test:{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.asyncio.Redis.from_url(CI_REDIS)
    await client.delete(name)
    await client.aclose()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path)
    s.start()
    yield s
    s.stop()


async def entries(url: str, stream: str) -> list[dict[str, str]]:
    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    try:
        found = await client.xrange(stream) or []
        return [{str(k): str(v) for k, v in (fields or {}).items()} for _, fields in found]
    finally:
        await client.aclose()


async def test_each_message_is_one_entry_with_its_id_key_payload_and_headers(
    stream: str,
) -> None:
    a = Appender(MemoryStore(), CI_REDIS)
    await a.bind(stream)
    plain = await a.add(headers={"X-Tenant": "acme"})
    keyed = new_message(TOPIC, {"order": 8}, a.now, key="order-8")
    async with a.store.begin() as tx:
        await a.store.add(tx, keyed)

    assert await a.relay.drain() == 2
    await a.kinds.aclose()

    got = sorted(await entries(CI_REDIS, stream), key=lambda e: e["id"])
    assert got == [  # delivered concurrently: in either order
        {
            "id": str(plain.id),
            "topic": TOPIC,
            "payload": '{"order":7}',
            "headers": '{"x-tenant":"acme"}',
        },
        {"id": str(keyed.id), "topic": TOPIC, "key": "order-8", "payload": '{"order":8}'},
    ]


async def test_max_len_trims_the_stream_approximately(stream: str) -> None:
    a = Appender(MemoryStore(), CI_REDIS, batch=100)
    await a.bind(stream, maxLen=10)
    for _ in range(300):
        await a.add()

    assert await a.relay.drain() == 300
    await a.kinds.aclose()

    client = redis.asyncio.Redis.from_url(CI_REDIS)
    length = await client.xlen(stream)
    await client.aclose()
    assert 10 <= length < 300


async def test_a_redis_restart_is_retried_and_nothing_is_lost(server: RedisServer) -> None:
    a = Appender(MemoryStore(), server.url)
    await a.bind("orders")
    first = await a.add()
    assert await a.relay.drain() == 1

    server.stop(signal.SIGKILL)
    second = await a.add()
    await a.relay.drain()
    state = await a.store.get(second.id)
    assert (state.last_error or "").startswith("ConnectionError: redis: ")
    assert state.buried_at is None

    server.start()  # empty again: it keeps nothing on disk
    a.now += backoff(1)
    assert await a.relay.drain() == 1
    await a.kinds.aclose()

    assert [e["id"] for e in await entries(server.url, "orders")] == [str(second.id)]
    assert first.id != second.id
    assert await a.store.list_buried() == []


async def test_a_key_of_another_type_is_a_clear_error_then_buried(stream: str) -> None:
    client = redis.asyncio.Redis.from_url(CI_REDIS)
    await client.set(stream, "not a stream")
    await client.aclose()
    a = Appender(MemoryStore(), CI_REDIS, max_attempts=2)
    await a.bind(stream)
    m = await a.add()

    await a.relay.drain()
    a.now += backoff(1)
    await a.relay.drain()
    await a.kinds.aclose()

    state = await a.store.get(m.id)
    assert state.buried_at is not None
    assert "redis: WRONGTYPE" in (state.last_error or "")


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({}, "stream"),
        ({"stream": "orders*"}, "stream"),
        ({"stream": "orders", "maxLen": 0}, "maxLen"),
        ({"stream": "orders", "maxlen": 5}, "maxlen"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        HandlerKinds().mapping["redis"](config)


def test_the_allow_list_admits_named_streams_and_prefixes() -> None:
    kinds = HandlerKinds(redis=RedisSettings(allow="orders, audit:*"))
    for admitted in ("orders", "audit:eu", "audit:"):
        kinds.mapping["redis"]({"stream": admitted})
    for refused in ("orders2", "billing", "audi"):
        with pytest.raises(ValueError, match="not in OUTBOX_REDIS_ALLOW"):
            kinds.mapping["redis"]({"stream": refused})


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis://:hunter2@cache:6379/0", "OUTBOX_REDIS_PASSWORD"),
        ("http://cache:6379", "redis://"),
    ],
)
def test_bad_settings_name_the_variable_and_keep_the_password_out(
    url: str, complaint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_REDIS_URL", url)
    with pytest.raises(ConfigError, match=complaint) as caught:
        load(RedisSettings)
    assert "OUTBOX_REDIS_URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_the_resource_and_the_cli_spell_the_config_alike() -> None:
    spec = {"stream": "orders", "maxLen": 100}  # spec.redis, and --config

    assert RedisConfig.model_validate(KIND.config_of(spec)) == RedisConfig.model_validate(spec)


def test_a_ca_file_is_for_a_tls_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    monkeypatch.setenv("OUTBOX_REDIS_CA_FILE", str(ca))
    with pytest.raises(ConfigError, match=r"OUTBOX_REDIS_CA_FILE: is for a rediss://"):
        load(RedisSettings)
    monkeypatch.setenv("OUTBOX_REDIS_URL", "rediss://cache:6380/0")
    assert load(RedisSettings).ca_file == ca
