"""The instant tests start their injected clocks at (relay logic never reads the wall clock)."""

from __future__ import annotations

import datetime as dt

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
"""A fixed, timezone-aware start: tests move their clock from here instead of sleeping."""
