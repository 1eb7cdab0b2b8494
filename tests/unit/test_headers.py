"""Message headers: what new_message accepts, and what it refuses with the reason."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest

from outbox import new_message
from outbox.headers import MAX_HEADERS, MAX_VALUE
from outbox.message import check_message
from tests.clock import T0


def test_headers_are_kept_with_lower_case_names() -> None:
    m = new_message("orders.placed", {}, T0, headers={"X-Tenant": "acme", "b3": "1"})

    assert m.headers == {"x-tenant": "acme", "b3": "1"}
    assert check_message(m) is m


def test_a_message_without_headers_has_none() -> None:
    assert new_message("orders.placed", {}, T0).headers == {}
    assert new_message("orders.placed", {}, T0, headers={}).headers == {}


@pytest.mark.parametrize(
    ("headers", "complaint"),
    [
        ({"Content-Length": "0"}, "Content-Length is reserved"),
        ({"host": "evil.example"}, "reserved"),
        ({"Nats-Msg-Id": "x"}, "reserved"),
        ({"Nats-Expected-Stream": "x"}, "reserved"),
        ({"Outbox-Attempt": "9"}, "reserved"),
        ({"webhook-signature": "v1,x"}, "reserved"),
        ({"ce-type": "x"}, "reserved"),
        ({"Idempotency-Key": "x"}, "reserved"),
        ({"X-Bad Name": "x"}, "not an HTTP token"),
        ({"": "x"}, "not an HTTP token"),
        ({"x" * 101: "x"}, "not an HTTP token"),
        ({"X-A": "line\r\nHost: b"}, "printable ASCII"),
        ({"X-A": "caf\u00e9"}, "printable ASCII"),
        ({"X-A": "x" * (MAX_VALUE + 1)}, "printable ASCII"),
        ({"X-A": 1}, "a string, not int"),
        ({"X-A": "1", "x-a": "2"}, "appears twice"),
        ({f"h{n}": "x" for n in range(MAX_HEADERS + 1)}, f"at most {MAX_HEADERS} headers"),
        ({f"h{n}": "x" * 4000 for n in range(5)}, "at most 16384"),
    ],
)
def test_bad_headers_are_refused_with_the_reason(headers: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        new_message("orders.placed", {}, T0, headers=headers)


def test_a_message_built_by_hand_with_upper_case_names_is_refused() -> None:
    m = dataclasses.replace(new_message("orders.placed", {}, T0), headers={"X-Tenant": "a"})

    with pytest.raises(ValueError, match="lower case"):
        check_message(m)


def test_without_opentelemetry_in_use_nothing_is_imported_or_stored() -> None:
    import subprocess

    probe = (
        "import sys; from outbox import new_message; "
        "m = new_message('orders.placed', {}); "
        "print(m.headers, any(n.startswith('opentelemetry') for n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["{}", "False"]
