"""Console sessions: a signed, expiring cookie, its row in the database, and the CSRF token bound to it.

The cookie holds ``{"sid", "auth", "exp"}`` as base64url JSON and an HMAC-SHA256 of it. Its key is derived
(HKDF-SHA256) from the admin token, so changing the token ends every session. A signed-in session is also a
row of ``console_sessions`` (keyed by a digest of its id, so the table holds nothing a cookie could be made
from), which every instance on the database reads: signing out deletes the row and the cookie is no good
anywhere from then on, even a copy taken before; *Sign out everywhere* deletes them all. Without an admin
token the console needs no login; the key is then random per process, the cookie carries only the CSRF
binding, and nothing is stored.

The CSRF token of a form is an HMAC of the session id under a key of its own: a form is only good with the
session it was rendered for, and a new session (each login) gets new tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procurd.core.clock import utcnow
from procurd.operations.sign_in import SignIn

SESSION_COOKIE = "procurd_console"
FLASH_COOKIE = "procurd_console_flash"
FLASH_SECONDS = 120
MAX_FLASH_CHARS = 500
MAX_COOKIE_CHARS = 4096


def hkdf_sha256(secret: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 HKDF with SHA-256."""
    pseudo_random_key = hmac.new(salt, secret, hashlib.sha256).digest()
    output, block, counter = b"", b"", 1
    while len(output) < length:
        block = hmac.new(pseudo_random_key, block + info + bytes([counter]), hashlib.sha256).digest()
        output += block
        counter += 1
    return output[:length]


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    authenticated: bool
    expires_at: int


@dataclass(frozen=True, slots=True)
class Flash:
    """A one-time message shown on the page a form's redirect leads to."""

    level: str  # ok | error
    text: str


def session_key(session: Session) -> str:
    """The session's key in ``console_sessions``: a digest of its id (the row alone opens nothing)."""
    return hashlib.sha256(session.sid.encode()).hexdigest()


class SessionBook:
    """The signed-in sessions, in the database every instance shares (:class:`procurd.operations.sign_in.
    SignIn`)."""

    def __init__(self, sign_in: SignIn, clock: Callable[[], float] = time.time) -> None:
        self.sign_in = sign_in
        self.clock = clock

    async def alive(self, session: Session) -> bool:
        """Whether the signed-in session was not signed out (one glance at its row)."""
        expires = await self.sign_in.session_expiry(session_key(session))
        return expires is not None and expires > self.clock()

    async def start(self, session: Session, address: str | None) -> None:
        await self.sign_in.start_session(session_key(session), session.expires_at, address, utcnow())

    async def end(self, session: Session) -> bool:
        return await self.sign_in.end_session(session_key(session))

    async def end_all(self) -> int:
        return await self.sign_in.end_all_sessions()


class SessionCodec:
    """Issues, signs and checks sessions, their CSRF tokens and flash messages."""

    def __init__(self, admin_token: str, lifetime_seconds: float, clock: Callable[[], float] = time.time):
        secret = admin_token.encode() if admin_token else secrets.token_bytes(32)
        salt = b"procurd admin console"
        self._session_key = hkdf_sha256(secret, salt, b"session cookie v1")
        self._csrf_key = hkdf_sha256(secret, salt, b"csrf token v1")
        self._flash_key = hkdf_sha256(secret, salt, b"flash cookie v1")
        self.lifetime = lifetime_seconds
        self.clock = clock

    def issue(self, *, authenticated: bool) -> Session:
        expires_at = int(self.clock() + self.lifetime)
        return Session(secrets.token_urlsafe(18), authenticated, expires_at)

    def encode(self, session: Session) -> str:
        return self._sign(self._session_key, {"sid": session.sid, "auth": session.authenticated,
                                              "exp": session.expires_at})  # fmt: skip

    def decode(self, value: str | None) -> Session | None:
        """The session in a cookie value; ``None`` when missing, forged, malformed or expired."""
        data = self._unsign(self._session_key, value)
        if data is None:
            return None
        sid, authenticated = data.get("sid"), data.get("auth")
        if not isinstance(sid, str) or not isinstance(authenticated, bool):
            return None
        return Session(sid, authenticated, int(data["exp"]))

    def csrf_token(self, session: Session) -> str:
        return _b64encode(hmac.new(self._csrf_key, session.sid.encode(), hashlib.sha256).digest())

    def csrf_valid(self, session: Session, given: str) -> bool:
        return hmac.compare_digest(self.csrf_token(session).encode(), given.encode("utf-8", "replace"))

    def encode_flash(self, flash: Flash) -> str:
        text = flash.text[:MAX_FLASH_CHARS]
        return self._sign(self._flash_key, {"level": flash.level, "text": text,
                                            "exp": int(self.clock() + FLASH_SECONDS)})  # fmt: skip

    def decode_flash(self, value: str | None) -> Flash | None:
        data = self._unsign(self._flash_key, value)
        if data is None or data.get("level") not in ("ok", "error") or not isinstance(data.get("text"), str):
            return None
        return Flash(data["level"], data["text"])

    def _sign(self, key: bytes, data: dict[str, Any]) -> str:
        payload = _b64encode(json.dumps(data, separators=(",", ":")).encode())
        signature = _b64encode(hmac.new(key, payload.encode(), hashlib.sha256).digest())
        return f"{payload}.{signature}"

    def _unsign(self, key: bytes, value: str | None) -> dict[str, Any] | None:
        if not value or len(value) > MAX_COOKIE_CHARS or not value.isascii():
            return None
        payload, _, signature = value.partition(".")
        expected = _b64encode(hmac.new(key, payload.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            return None
        try:
            data = json.loads(_b64decode(payload))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(data, dict):
            return None
        expires_at = data.get("exp")
        if isinstance(expires_at, bool) or not isinstance(expires_at, int) or expires_at <= self.clock():
            return None
        return data
