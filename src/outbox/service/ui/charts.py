"""The overview's charts: each topic's backlog, delivery rate and burial rate
over the last hours, read from the Prometheus that scrapes the relays
(OUTBOX_UI_PROMETHEUS_URL) and drawn as a small SVG, loaded apart from the
page. Bounded like every read: one range query a chart, a deadline, a cap on
the answer's size and on the series drawn (the topics with the most)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import json
import math
from collections.abc import Callable

import aiohttp

__all__ = ["CHARTS", "ChartUnavailable", "Charts"]

MAX_ANSWER = 4 * 1024 * 1024
"""Largest answer read from Prometheus."""
MAX_SERIES = 6
"""Most topics one chart draws (the largest)."""
POINTS = 120
"""Points a series has over the chart's hours."""
WIDTH, HEIGHT = 480, 210
Series = tuple[str, list[tuple[float, float]]]
"""A topic and its (unix time, value) points."""
COLOURS = ("#2457c5", "#b3261e", "#1e7a3c", "#8a5a00", "#6b3fa0", "#00796b")


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    title: str
    query: str
    """PromQL, {selector} standing for the topic's label matcher."""
    unit: str


CHARTS = {
    "backlog": Chart("Backlog", "max by (topic) (outbox_pending_messages{selector})", "messages"),
    "delivered": Chart(
        "Deliveries", "sum by (topic) (rate(outbox_delivered_total{selector}[5m]))", "/s"
    ),
    "buried": Chart("Burials", "sum by (topic) (rate(outbox_buried_total{selector}[5m]))", "/s"),
}


class ChartUnavailable(Exception):
    """Prometheus did not answer, or not as expected."""


class Charts:
    """Range queries against ``url`` and their drawings."""

    def __init__(
        self,
        url: str,
        *,
        hours: int = 6,
        timeout: float = 5.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.url = url.rstrip("/")
        self.hours = hours
        self.timeout = timeout
        self.clock = clock

    async def series(
        self, name: str, topic: str | None
    ) -> list[tuple[str, list[tuple[float, float]]]]:
        """The chart's series: (topic, [(unix time, value)]), largest first."""
        chart = CHARTS[name]
        selector = "" if topic is None else f'{{topic="{_escaped(topic)}"}}'
        query = chart.query.replace("{selector}", selector)
        end = self.clock().timestamp()
        start = end - self.hours * 3600
        params = {
            "query": query,
            "start": f"{start:.0f}",
            "end": f"{end:.0f}",
            "step": f"{max((end - start) / POINTS, 15):.0f}",
        }
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(
                    f"{self.url}/api/v1/query_range", params=params, allow_redirects=False
                ) as response,
            ):
                if response.status != 200:
                    raise ChartUnavailable(f"Prometheus answered {response.status}")
                raw = await response.content.read(MAX_ANSWER + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ChartUnavailable(f"Prometheus is unreachable: {type(exc).__name__}") from None
        if len(raw) > MAX_ANSWER:
            raise ChartUnavailable("Prometheus's answer is too large")
        try:
            result = json.loads(raw)["data"]["result"]
            found = [
                (
                    str(r["metric"].get("topic", "")),
                    [(float(t), float(v)) for t, v in r["values"]],
                )
                for r in result
            ]
        except (ValueError, KeyError, TypeError):
            raise ChartUnavailable("Prometheus's answer is not a range result") from None
        found.sort(key=lambda s: -max((v for _, v in s[1] if math.isfinite(v)), default=0))
        return found[:MAX_SERIES]

    async def svg(self, name: str, topic: str | None) -> str:
        """The chart drawn, or a drawing that says why there is none."""
        chart = CHARTS[name]
        try:
            series = await self.series(name, topic)
        except ChartUnavailable as exc:
            return _frame(
                chart.title, f'<text x="12" y="100" class="m">{html.escape(str(exc))}</text>'
            )
        return draw(chart.title, chart.unit, series, self.hours)


def draw(
    title: str, unit: str, series: list[tuple[str, list[tuple[float, float]]]], hours: int
) -> str:
    """An SVG line chart of ``series`` (at most MAX_SERIES)."""
    points = [(t, v) for _, values in series for t, v in values if math.isfinite(v)]
    if not points:
        return _frame(title, _note("no data in Prometheus yet"))
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    top = max(v for _, v in points) or 1.0
    left, right, upper, lower = 48, WIDTH - 8, 24, HEIGHT - 40
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return left + (t - t0) / span * (right - left)

    def y(v: float) -> float:
        return lower - v / top * (lower - upper)

    parts = [
        f'<line x1="{left}" y1="{lower}" x2="{right}" y2="{lower}" class="a"/>',
        f'<text x="{left - 4}" y="{upper + 4}" class="m" text-anchor="end">{_number(top)}</text>',
        f'<text x="{left - 4}" y="{lower}" class="m" text-anchor="end">0</text>',
        f'<text x="{left}" y="{lower + 14}" class="m">{hours} h ago</text>',
        f'<text x="{right}" y="{lower + 14}" class="m" text-anchor="end">now ({unit})</text>',
    ]
    for n, (topic, values) in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in values if math.isfinite(v))
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
        lx, ly = left + (n % 3) * 140, HEIGHT - 14 + (n // 3) * 12
        label = html.escape(topic[:22])
        parts.append(f'<text x="{lx}" y="{ly}" class="l" fill="{colour}">{label}</text>')
    return _frame(title, "".join(parts))


def _frame(title: str, body: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="system-ui, sans-serif">'
        "<style>.m{font-size:11px;fill:#5b6474}.l{font-size:11px}.a{stroke:#d8dde6}"
        ".t{font-size:13px;font-weight:600;fill:#1d2330}.s{stroke-width:1.5}</style>"
        f'<text x="8" y="16" class="t">{html.escape(title)}</text>{body}</svg>'
    )


def _note(text: str) -> str:
    return f'<text x="12" y="100" class="m">{html.escape(text)}</text>'


def _number(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
