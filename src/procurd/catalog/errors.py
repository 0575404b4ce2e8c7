"""Why a catalogue pass failed, in one line fit for ``sync_runs.error`` and logs."""

from __future__ import annotations

from typing import Final

from procurd.catalog.ports import StorageFailures
from procurd.core.listing import IncompleteListing
from procurd.logs import scrub
from procurd.upstream.errors import UpstreamError, truncate

MAX_ERROR_CHARS: Final = 500


class LeaseLost(Exception):
    """Another instance took the sync lease while this pass was running."""


def describe_error(exc: BaseException, storage: StorageFailures) -> str:
    """One line about a failure, fit for ``sync_runs.error`` and logs: no secrets, no SQL parameters."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, UpstreamError | IncompleteListing | LeaseLost):
        text = str(exc)
    else:
        text = storage.failure(exc) or f"{type(exc).__name__}: {exc}"
    return truncate(scrub(text), MAX_ERROR_CHARS)
