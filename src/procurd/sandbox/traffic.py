"""What the signed API was asked: each request's arrival, API key and endpoint, whether the rate limit
refused it, and whether it carried a valid signature (a strict upstream counts one that does not as a
failed authentication). Tests read it to assert "no rate-limit answers", "every request signed", or to
measure request rates."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ALL_ENDPOINTS = "*"
UNKNOWN_ENDPOINT = "unknown"
DEFAULT_CAPACITY = 100_000  # the oldest records are forgotten beyond this many


@dataclass(frozen=True, slots=True)
class RequestRecord:
    at: float  # the site's clock (Unix seconds, its offset included) when the request arrived
    api_key: str  # as the request named it; "" when the header was missing
    endpoint: str  # the endpoint's name, or "unknown" for a path or method the API does not have
    rate_limited: bool
    authenticated: bool | None = None  # signature headers valid for an active key; None: not looked at

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "api_key": self.api_key,
            "endpoint": self.endpoint,
            "rate_limited": self.rate_limited,
            "authenticated": self.authenticated,
        }


def tally(records: Iterable[RequestRecord]) -> dict[str, dict[str, dict[str, int]]]:
    """Per API key, per endpoint (and ``*`` for all of the key's): requests and how many were rate-limited."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for record in records:
        per_key = counts.setdefault(record.api_key, {})
        for endpoint in (record.endpoint, ALL_ENDPOINTS):
            entry = per_key.setdefault(endpoint, {"requests": 0, "rate_limited": 0})
            entry["requests"] += 1
            entry["rate_limited"] += record.rate_limited
    return counts


class RequestLog:
    """The last ``capacity`` requests to the signed API, oldest first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=capacity)

    def add(self, record: RequestRecord) -> None:
        self._records.append(record)

    def select(self, since: float | None = None, api_key: str | None = None) -> list[RequestRecord]:
        """The records that arrived at or after ``since`` (all for None), of ``api_key`` (any for None)."""
        return [
            record
            for record in self._records
            if (since is None or record.at >= since) and api_key in (None, record.api_key)
        ]

    def clear(self) -> None:
        self._records.clear()
