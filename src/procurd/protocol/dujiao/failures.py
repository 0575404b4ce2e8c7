"""The protocol's failure answers (seed 000 part 7): ``{"ok": false, "error_code", "error_message"}`` with
the HTTP status each code has on the real sites."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Which authentication failures are 401 and which 403, as the real sites answer them.
AUTH_FAILURE_STATUS = {
    "missing_auth_headers": 401,
    "invalid_timestamp": 401,
    "timestamp_expired": 401,
    "invalid_signature": 401,
    "invalid_api_key": 403,
    "user_disabled": 403,
}


class ErrorAnswer(Exception):
    """A failure answer of the signed API: HTTP status, ``error_code``, ``error_message``, and fields the
    answer carries besides (a ``payment_failed`` answer's order, say)."""

    def __init__(self, status: int, code: str, message: str, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"ok": False, **self.extra, "error_code": self.code, "error_message": self.message}


def bad_request(message: str) -> ErrorAnswer:
    return ErrorAnswer(400, "bad_request", message)


def auth_failure(code: str, message: str) -> ErrorAnswer:
    return ErrorAnswer(AUTH_FAILURE_STATUS[code], code, message)


def internal_error() -> ErrorAnswer:
    return ErrorAnswer(500, "internal_error", "internal server error")
