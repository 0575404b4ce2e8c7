"""Structured logging: JSON lines for machines, readable lines on a terminal, secrets never written.

Context (request id, upstream, order number) is bound with :func:`structlog.contextvars.bound_contextvars`
and merged into every line. Two layers keep secrets out:

* keys that name a secret (``api_secret``, ``token``, ``signature``, ``payload``, ...) are masked whatever
  their value;
* every configured secret value (API secrets, admin token, webhook secret) is registered with
  :func:`register_secret` and masked wherever it appears inside any string, including exception text.

Every value is written as JSON's own types (:func:`plain_values`): a datetime is ISO 8601, a Decimal its exact
text, never a Python repr, whichever event logs it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer
from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[redacted]"
SENSITIVE_KEYS = frozenset(
    {
        "api_secret",
        "app_key",
        "sign",
        "secret",
        "webhook_secret",
        "admin_token",
        "token",
        "authorization",
        "password",
        "signature",
        "payload",
        "delivery_data",
        "manual_form_data",
        "card",
        "cards",
    }
)
# Secrets shorter than this are not searched for inside other strings: masking every "a" would destroy logs.
_MIN_SECRET_LENGTH = 6
_secret_values: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in a log line from now on."""
    if value and len(value) >= _MIN_SECRET_LENGTH:
        _secret_values.add(value)


def register_secrets(values: Iterable[str | None]) -> None:
    for value in values:
        register_secret(value)


def scrub(text: str) -> str:
    """``text`` with every registered secret value masked."""
    for secret in _secret_values:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _redact_value(key: str, value: Any) -> Any:
    if key.lower() in SENSITIVE_KEYS or key.lower().endswith(("_secret", "_token", "_password")):
        return REDACTED if value not in (None, "") else value
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, Mapping):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value("", v) for v in value]
    return value


def plain(value: Any) -> Any:
    """``value`` as JSON's own types, so that no log line carries a Python repr: a datetime as ISO 8601
    (UTC with ``Z``), a date and a time of day as ISO 8601, a duration as seconds, a Decimal as its exact
    text, an enum as its value, a mapping and a sequence element by element (a set sorted), anything else
    as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((plain(item) for item in value), key=str)
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def plain_values(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: every value as :func:`plain` makes it (before secrets are masked, so that the
    text of any object is scrubbed too); what later processors read as it is (``exc_info``, ``stack_info``,
    structlog's own ``_record`` ...) is left alone."""
    return {
        key: value if key in _PROCESSOR_KEYS or key.startswith("_") else plain(value)
        for key, value in event_dict.items()
    }


_PROCESSOR_KEYS = frozenset({"exc_info", "stack_info"})


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask sensitive keys and registered secret values (runs last before rendering)."""
    return {key: _redact_value(key, value) for key, value in event_dict.items()}


def _scrub_rendered(_logger: WrappedLogger, _method: str, rendered: Any) -> Any:
    # Exception text is rendered after redact_secrets ran; scrub the final line as well.
    return scrub(rendered) if isinstance(rendered, str) else rendered


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog and route the standard library's loggers (aiohttp, SQLAlchemy, APScheduler)."""
    stream = stream or sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and stream.isatty())
    numeric_level = logging.getLevelNamesMapping()[level.upper()]

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    if use_console:
        # Tracebacks without local variables: they may hold secrets and delivered goods.
        renderer = structlog.dev.ConsoleRenderer(
            colors=stream.isatty(),
            exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False)
            if _rich_available()
            else structlog.dev.plain_traceback,
        )
        exception_processors: list[Processor] = []
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        exception_processors = [
            structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
        ]

    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            *exception_processors,
            plain_values,
            redact_secrets,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, *exception_processors, plain_values, redact_secrets],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            renderer,
            _scrub_rendered,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    # Library chatter stays at warning, even when we debug: aiosqlite's debug lines carry every SQL
    # parameter, delivered payloads included.
    for noisy in ("aiohttp.access", "sqlalchemy.engine", "apscheduler", "asyncio", "alembic", "aiosqlite"):
        logging.getLogger(noisy).setLevel(max(numeric_level, logging.WARNING))


@contextmanager
def log_stream(stream: TextIO) -> Iterator[None]:
    """Write log lines to ``stream`` for a while (the console of a progress display, so that they appear
    above it instead of through it), then to where they went before."""
    handlers = [
        handler for handler in logging.getLogger().handlers if isinstance(handler, logging.StreamHandler)
    ]
    previous = [handler.stream for handler in handlers]
    for handler in handlers:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            handler.setStream(old)


@contextmanager
def muted_on_terminal() -> Iterator[None]:
    """Leave out the log lines that would be written to a terminal during the block: a person there reads
    the one sentence that follows instead. A file, a pipe or the journal still gets every line."""
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler, logging.StreamHandler) and _is_terminal(handler.stream)
    ]
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:  # pragma: no cover - rich is a dependency
        return False
    return True


def bind(**values: Any) -> None:
    """Bind values to the current context (task-local through contextvars)."""
    structlog.contextvars.bind_contextvars(**values)
