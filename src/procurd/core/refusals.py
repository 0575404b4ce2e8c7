"""The one way an operation says no: :class:`Refused`, whatever entry point asked.

The admin API answers a refusal with its ``status`` and ``{"ok": false, "error_code", "error_message"}``,
the console shows it as an error page, and the command line prints ``procurd: CODE: MESSAGE`` and exits 1.
Nothing changed when an operation is refused.
"""

from __future__ import annotations

from typing import Any


class Refused(Exception):
    """An operation that does not apply: the HTTP status the admin API answers it with, a stable error
    code, a sentence for a person, and extra fields for the answer (never a secret)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def not_found(code: str, message: str) -> Refused:
    return Refused(404, code, message)


def invalid(code: str, message: str) -> Refused:
    return Refused(400, code, message)
