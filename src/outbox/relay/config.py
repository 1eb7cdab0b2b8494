"""The relay's tunables: interval, timeout, lease, batch, concurrency, attempts, the grace.

Durations are ``timedelta`` here; strings like ``250ms`` or ``1m30s`` are
parsed at this edge only (outbox.settings.Duration). Reading them from the
environment is the service's (outbox.service.settings.RelaySettings).
"""

from __future__ import annotations

import datetime as dt

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from outbox.durations import format_duration
from outbox.settings import Duration

__all__ = ["CLAIM_WAIT", "KEY_RUN", "STORE_WAIT", "Duration", "RelayConfig"]

KEY_RUN = 256
"""Most messages of one key a claim takes after the key's head (handed over in
turn). Runs take at most half the free slots beside the claim's heads: a hot
key is a few claims, and one key never fills a relay that has others."""
WATERMARK_SLACK = dt.timedelta(seconds=2)
"""While a snapshot is held, a claim reads the ready rows from the due time of
the last one the claim before found, less this much (see Relay._claim)."""
FULL_LOOK = 30.0
"""...and from the first, to find what a watermark passes over (a transaction
that committed late, a message released with an old due time), at least this
often (seconds), and after every ack that unparked a key. Such a look visits
every entry the snapshot keeps (a second's worth at a million): rare enough
that few messages wait behind it."""
CLAIM_WAIT = 15.0
"""Longest a claim may take (PostgresStore bounds its own at 10 s)."""
STORE_WAIT = 5.0
"""Longest wait for a pool connection (service.process sizes its pool's timeout
so): a store call during an outage fails within this."""


class RelayConfig(BaseModel):
    """Tunes a Relay.

    Built in code, it takes its arguments and the defaults, never the
    environment: ``RelayConfig(batch=50)`` in an application means batch 50
    whatever OUTBOX_BATCH says. ``outbox.service.settings.relay_config()`` (what
    `outbox relay` runs with) reads OUTBOX_<NAME> and raises ConfigError naming
    the variable.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval: Duration = Field(
        default=dt.timedelta(seconds=1),
        gt=dt.timedelta(0),
        description="Wait between outbox polls once no message is due.",
    )
    timeout: Duration = Field(
        default=dt.timedelta(seconds=30),
        gt=dt.timedelta(0),
        description="Longest one delivery may take.",
    )
    lease: Duration = Field(
        default=dt.timedelta(minutes=2),
        gt=dt.timedelta(0),
        description="How long a claimed message stays claimed; must outlast the timeout.",
    )
    batch: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description=(
            "Messages claimed per poll; claims grow (up to the free slots)"
            " while a backlog fills each one."
        ),
    )
    max_attempts: int = Field(
        default=8, ge=1, le=1_000, description="Deliveries tried before a message is buried."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description=(
            "Most deliveries one relay keeps in flight; it claims more as they finish. "
            "Unset: 8 x OUTBOX_BATCH."
        ),
    )
    in_flight_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=2**40,
        description=(
            "Most payload bytes one relay holds in flight (claims stop short of it; the "
            "first message of a claim is always taken), so large payloads cannot exhaust "
            "its memory. See docs/operators/running.md, 'Memory budget'."
        ),
    )
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description=(
            "Most deliveries of one topic in flight in one relay (a topic's maxInFlight "
            "overrides it). Unset: no cap below OUTBOX_CONCURRENCY."
        ),
    )
    unserved_grace: Duration = Field(
        default=dt.timedelta(minutes=10),
        gt=dt.timedelta(0),
        description=(
            "How long a topic no live relay serves waits before its messages are buried "
            "with 'no handler' (covers rolling deploys)."
        ),
    )
    snapshot_held_after: Duration = Field(
        default=dt.timedelta(seconds=30),
        ge=dt.timedelta(0),
        description=(
            "Age of the oldest snapshot from which claims read on from where the last ones "
            "stopped (with a look from the first every 30s): what is deleted while a snapshot "
            "is held stays in the indexes. Seen at each backlog refresh."
        ),
    )

    @property
    def slots(self) -> int:
        """OUTBOX_CONCURRENCY, or its default: eight batches."""
        return self.concurrency or 8 * self.batch

    @field_validator("lease")
    @classmethod
    def _lease_outlasts_timeout(cls, lease: dt.timedelta, info: ValidationInfo) -> dt.timedelta:
        timeout = info.data.get("timeout")
        if timeout is not None and lease <= timeout:
            raise ValueError(
                f"must outlast OUTBOX_TIMEOUT ({format_duration(timeout)}), or a slow "
                f"delivery can overlap its own retry; got {format_duration(lease)}"
            )
        return lease
