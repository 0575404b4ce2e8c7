"""The real sites' kind of rate limit: ``limit`` requests per sliding window per key, then the key blocked.

The sandbox keys it on the raw API key (as Dujiao-Next does, before the signature is checked); the provider
on the verified account, and failed authentications on the client's address.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _KeyWindow:
    hits: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0


class RateLimiter:
    """``limit`` requests per ``window`` seconds per key; the one over the limit blocks the key for
    ``block`` seconds, during which every request is refused."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._keys: dict[str, _KeyWindow] = {}
        self._next_sweep = float("-inf")

    def __len__(self) -> int:
        """How many keys are remembered."""
        return len(self._keys)

    def allow(self, key: str, limit: int, window: float, block: float) -> bool:
        now = self._clock()
        if now >= self._next_sweep:
            self._forget_quiet(now, window)
            self._next_sweep = now + window
        state = self._keys.setdefault(key, _KeyWindow())
        if now < state.blocked_until:
            return False
        hits = state.hits
        while hits and hits[0] <= now - window:
            hits.popleft()
        if len(hits) >= limit:
            hits.clear()
            state.blocked_until = now + block
            return False
        hits.append(now)
        return True

    def _forget_quiet(self, now: float, window: float) -> None:
        """Forget the keys without a request in the last ``window`` and not blocked: what they hold counts
        for nothing any more, and keys a stranger makes up (addresses, raw API keys) would otherwise be kept
        for ever."""
        quiet = [
            key
            for key, state in self._keys.items()
            if now >= state.blocked_until and (not state.hits or state.hits[-1] <= now - window)
        ]
        for key in quiet:
            del self._keys[key]

    def blocked(self, key: str) -> bool:
        state = self._keys.get(key)
        return state is not None and self._clock() < state.blocked_until

    def blocked_for(self, key: str) -> float:
        """Seconds the key stays blocked (0 when it is not)."""
        state = self._keys.get(key)
        return 0.0 if state is None else max(0.0, state.blocked_until - self._clock())

    def reset(self) -> None:
        self._keys.clear()
