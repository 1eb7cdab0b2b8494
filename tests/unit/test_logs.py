from __future__ import annotations

import io
import json
import logging

import pytest

from outbox.service import logs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        (
            "postgres://app:s3cret@db/app?sslmode=require",
            "postgres://app:***@db/app?sslmode=require",
        ),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
        ("password='s3 cret' host=db", "password=*** host=db"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_redact_masks_passwords(text: str, expected: str) -> None:
    assert logs.redact(text) == expected


def _emit(fmt: str, message: str, *args: object) -> str:
    stream = io.StringIO()
    logs.configure("info", fmt, stream)
    logging.getLogger("outbox.test").info(message, *args)
    logging.getLogger().handlers.clear()
    return stream.getvalue()


def test_json_lines_carry_time_level_logger_and_redacted_message() -> None:
    line = _emit("json", "connecting to %s", "postgresql://u:pw123@h/d")

    entry = json.loads(line)
    assert entry["level"] == "info"
    assert entry["logger"] == "outbox.test"
    assert entry["message"] == "connecting to postgresql://u:***@h/d"
    assert entry["time"].endswith("Z")


def test_text_format_is_one_readable_redacted_line() -> None:
    line = _emit("text", "password=%s", "pw123")

    assert line.endswith("INFO outbox.test: password=***\n")


def test_auto_format_is_json_off_a_terminal() -> None:
    assert json.loads(_emit("auto", "hello"))["message"] == "hello"
