"""Who may govern which topics: OUTBOX_CONTROLLER_GRANTS.

Creating an OutboxTopic is reading the payloads of its topic (a webhook or
NATS subject of the author's choice receives them), so the deployer, not the
resource's author, decides which namespace may govern which topics. A grant
is ``NAMESPACE=PATTERN`` (PATTERN is a topic, or a prefix ending in ``*``;
NAMESPACE ``*`` is any namespace); ``:reroute`` after it also lets the
namespace send a topic that has a built-in or application handler to a
handler kind instead. With grants configured, a resource outside every grant
is Invalid. With none, a resource may still never reroute a topic that a
built-in or application handler serves: secure by default, not only in the
chart (which grants its release namespace its own default OutboxTopics).
"""

from __future__ import annotations

import dataclasses
import re

from outbox.message import validate_topic

__all__ = ["NO_GRANTS", "Grant", "Grants", "parse_grants"]

_NAMESPACE = re.compile(r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$")


@dataclasses.dataclass(frozen=True)
class Grant:
    namespace: str
    pattern: str
    reroute: bool = False

    def covers(self, namespace: str, topic: str) -> bool:
        if self.namespace not in ("*", namespace):
            return False
        if self.pattern.endswith("*"):
            return topic.startswith(self.pattern[:-1])
        return topic == self.pattern

    def __str__(self) -> str:
        return f"{self.namespace}={self.pattern}{':reroute' if self.reroute else ''}"


@dataclasses.dataclass(frozen=True)
class Grants:
    """The grants, in order; ``configured`` False when none were given."""

    items: tuple[Grant, ...] = ()

    @property
    def configured(self) -> bool:
        return bool(self.items)

    def find(self, namespace: str, topic: str) -> list[Grant]:
        return [g for g in self.items if g.covers(namespace, topic)]


NO_GRANTS = Grants()


def parse_grants(text: str) -> Grants:
    """Grants from ``ns=pattern[:reroute]`` entries separated by commas or spaces."""
    items = []
    for raw in re.split(r"[,\s]+", text.strip()):
        if not raw:
            continue
        namespace, sep, rest = raw.partition("=")
        pattern, _, flag = rest.partition(":")
        if not sep or not _NAMESPACE.match(namespace) or flag not in ("", "reroute"):
            raise ValueError(
                f"{raw!r} is not NAMESPACE=TOPIC, NAMESPACE=PREFIX* or either with :reroute "
                "(like outbox=mail.*, billing=orders.placed:reroute)"
            )
        probe = pattern[:-1] + "x" if pattern.endswith("*") else pattern
        try:
            validate_topic(probe)
        except ValueError:
            raise ValueError(f"{raw!r}: {pattern!r} is not a topic or a topic prefix*") from None
        items.append(Grant(namespace, pattern, flag == "reroute"))
    return Grants(tuple(items))
