"""Structured logging: JSON lines, bound context, and secrets that never reach the output."""

from __future__ import annotations

import io
import json
import logging
import pathlib
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
import structlog

import procurd
from procurd.core.procurement import State
from procurd.logs import REDACTED, bind, configure_logging, register_secret


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("debug", "json", stream)
    structlog.contextvars.clear_contextvars()
    yield stream
    structlog.contextvars.clear_contextvars()
    configure_logging("warning", "console", io.StringIO())


def lines(stream: io.StringIO, event: str | None = None) -> list[dict[str, object]]:
    """The JSON lines written, or only those of ``event`` (other tasks of the process may log too)."""
    parsed = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [line for line in parsed if event is None or line["event"] == event]


def test_json_line_has_level_time_and_context(output: io.StringIO) -> None:
    """Each event is one JSON object with level, UTC timestamp and the context bound earlier."""
    bind(order_no="A1001", upstream="main")
    structlog.get_logger("procurd.test").info("procurement.submitted", attempt=1)
    (line,) = lines(output, "procurement.submitted")
    assert line["event"] == "procurement.submitted"
    assert line["level"] == "info"
    assert str(line["timestamp"]).endswith("Z")
    assert (line["order_no"], line["upstream"], line["attempt"]) == ("A1001", "main", 1)


def test_sensitive_keys_are_masked(output: io.StringIO) -> None:
    """Values under secret-like keys (secret, token, signature, payload) are never written."""
    structlog.get_logger("t").info(
        "x", api_secret="s3cr3t-value", admin_token="tok-value", signature="abc123", payload="CARD-1234"
    )
    (line,) = lines(output, "x")
    assert line["api_secret"] == line["admin_token"] == line["signature"] == line["payload"] == REDACTED
    assert "s3cr3t" not in output.getvalue()
    assert "CARD-1234" not in output.getvalue()


def test_registered_secret_is_masked_inside_any_text(output: io.StringIO) -> None:
    """A registered secret value is masked wherever it appears, including nested values."""
    register_secret("very-secret-value-42")
    structlog.get_logger("t").warning(
        "oops", detail={"url": "x?k=very-secret-value-42"}, note="very-secret-value-42"
    )
    assert "very-secret-value-42" not in output.getvalue()
    assert REDACTED in output.getvalue()


def test_exception_traces_have_no_locals_and_no_secrets(output: io.StringIO) -> None:
    """Exception tracebacks show no local variables and no registered secret."""
    register_secret("trace-secret-value-7")

    def fail(secret: str) -> None:
        raise RuntimeError(f"failed with {secret}")

    try:
        fail("trace-secret-value-7")
    except RuntimeError:
        structlog.get_logger("t").exception("crash")
    text = output.getvalue()
    assert "trace-secret-value-7" not in text
    assert '"locals"' not in text
    assert "RuntimeError" in text


def test_stdlib_loggers_are_routed_through_the_same_pipeline(output: io.StringIO) -> None:
    """Standard library log records come out as the same JSON lines, scrubbed the same way."""
    register_secret("stdlib-secret-value")
    logging.getLogger("procurd.stdlib").warning("connect with %s", "stdlib-secret-value")
    (line,) = [line for line in lines(output) if str(line["event"]).startswith("connect with")]
    assert line["level"] == "warning"
    assert "stdlib-secret-value" not in output.getvalue()


def test_console_tracebacks_show_no_locals() -> None:
    """On a terminal, exception output has no local variables (they may hold delivered goods)."""
    stream = io.StringIO()
    configure_logging("debug", "console", stream)

    def fail(payload: str) -> None:
        raise RuntimeError("boom")

    payload = "-".join(["CARD", "SECRET", "PAYLOAD", "99"])  # never spelled out in the source shown
    try:
        fail(payload)
    except RuntimeError:
        structlog.get_logger("t").exception("crash")
    configure_logging("warning", "json", io.StringIO())
    assert "RuntimeError" in stream.getvalue()
    assert payload not in stream.getvalue()


def test_every_log_event_is_named_in_one_style() -> None:
    """Every event procurd logs is named ``area.what_happened`` (lowercase words with underscores, a dot
    between the parts), so that operators can filter on a prefix."""
    call = re.compile(r"\.(?:debug|info|warning|error|exception|critical)\(\s*\"([^\"]*)\"", re.S)
    style = re.compile(r"[a-z_]+(\.[a-z_]+)+")
    names = {
        name: str(path)
        for path in pathlib.Path(procurd.__file__).parent.rglob("*.py")
        for name in call.findall(path.read_text(encoding="utf-8"))
    }
    assert len(names) > 50
    assert {name: path for name, path in names.items() if not style.fullmatch(name)} == {}


def test_values_are_written_as_json_never_as_a_python_repr(output: io.StringIO) -> None:
    """Whatever an event logs is JSON's own: a datetime as ISO 8601 in UTC (what ``catalog.sync_started``
    logs as ``updated_after``), a Decimal as its exact text, an enum as its value, a set as a list, nested
    values too; no line holds a repr such as ``datetime.datetime(``."""
    moment = datetime(2026, 11, 25, 9, 30, 5, tzinfo=UTC)
    structlog.get_logger("procurd.test").info(
        "values.logged",
        updated_after=moment,
        local=moment.astimezone(timezone(timedelta(hours=8))),
        day=date(2026, 11, 25),
        amount=Decimal("9.90"),
        state=State.SUBMITTED,
        reasons={"b", "a"},
        nested={"at": [moment], "price": Decimal("0.10")},
        wait=timedelta(seconds=1.5),
    )
    (line,) = lines(output, "values.logged")
    assert line["updated_after"] == line["local"] == "2026-11-25T09:30:05Z"
    assert (line["day"], line["amount"], line["state"], line["wait"]) == (
        "2026-11-25",
        "9.90",
        "submitted",
        1.5,
    )
    assert line["reasons"] == ["a", "b"]
    assert line["nested"] == {"at": ["2026-11-25T09:30:05Z"], "price": "0.10"}
    assert "datetime.datetime(" not in output.getvalue()
    assert "Decimal(" not in output.getvalue()
