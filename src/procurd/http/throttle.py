"""Both doors of the admin listener, throttled: wrong admin tokens counted per client address.

The console's sign-in and the JSON API's bearer token take the same secret. Wrong tokens are counted per
client address in the database (table ``auth_failures``), so every instance on it adds to one count and makes
the address wait: after :data:`~procurd.core.throttle.FREE_FAILURES` wrong tokens each further one makes it
wait twice as long (up to :data:`~procurd.core.throttle.BACKOFF_CAP_SECONDS`), and a try made while it waits
is answered 429 with ``Retry-After`` without its token being looked at. The right token from another address
is never held up.

The client address is the peer's, or, when the peer is one of ``[server] trusted_proxies``, the first address
of ``X-Forwarded-For`` (read from the right) that is not a trusted proxy.

Costs on the way of a request: nothing for a token that is right from an address this instance has not seen
fail (the database is glanced at once a second per address, for a wait set by another instance); one write
for a wrong token. A burst is told once (the alert ``admin_auth_failures``, raised by the instance whose
write starts it) and logged as one summary line per minute per instance (``admin.auth_failures``), never a
line per try.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog
from aiohttp import web

from procurd.core.alerts import Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.throttle import (
    BACKOFF_CAP_SECONDS,
    FREE_FAILURES,
    Counted,
    Failures,
    after_failure,
    retry_after,
    wait_seconds,
)
from procurd.operations import DatabaseError, Operations

log = structlog.get_logger("procurd.admin")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SUMMARY_WINDOW_SECONDS = 60.0
CLEAR_FOR_SECONDS = 1.0  # a right token's address found not waiting is not looked up again for this long
MAX_REMEMBERED = 10_000  # addresses kept in memory (the database has them all)
MAX_ADDRESSES_SHOWN = 10
DOORS = ("console", "api")


def trusted_networks(proxies: Sequence[str]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def _ip(text: str) -> IpAddress | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_address(request: web.Request, trusted: Sequence[IpNetwork]) -> str:
    """The address of the client behind ``request``: the peer's, unless the peer is a trusted proxy; then
    the first address of ``X-Forwarded-For``, read from the right, that is not a trusted proxy (an entry
    that is no address stops the walk at the last trusted one)."""
    peer_text = request.remote or ""
    current = _ip(peer_text)
    if current is None:
        return peer_text[:64] or "unknown"
    if not trusted or not any(current in network for network in trusted):
        return str(current)
    hops = [hop for value in request.headers.getall("X-Forwarded-For", []) for hop in value.split(",")]
    for hop in reversed(hops):
        address = _ip(hop)
        if address is None:
            break
        current = address
        if not any(address in network for network in trusted):
            break
    return str(current)


class Throttled(Exception):
    """The address must wait ``seconds`` before a token from it is checked."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"wait {seconds:.1f} s")
        self.seconds = seconds

    @property
    def retry_after(self) -> int:
        return retry_after(self.seconds)


@dataclass
class _Window:
    """What this instance saw within one summary window."""

    started: float
    failures: Counter[str] = field(default_factory=Counter)  # by address
    doors: Counter[str] = field(default_factory=Counter)
    refused_unchecked: Counter[str] = field(default_factory=Counter)  # 429s, by address


class SignInThrottle:
    """The admin listener's count of wrong tokens (see the module's description)."""

    def __init__(self, operations: Operations) -> None:
        self.runtime = operations.runtime
        self.sign_in = operations.sign_in
        self.trusted = trusted_networks(self.runtime.settings.server.trusted_proxies)
        # What this instance knows of each address: its failures, as last read or written.
        self._known: OrderedDict[str, Failures] = OrderedDict()
        self._clear: dict[str, float] = {}  # address -> when it was last found not waiting (monotonic)
        self._window: _Window | None = None
        self._timer: asyncio.TimerHandle | None = None

    def address(self, request: web.Request) -> str:
        return client_address(request, self.trusted)

    # --- the checks -------------------------------------------------------------------------------------

    def check_waiting(self, address: str, door: str) -> None:
        """Raise :class:`Throttled` when this instance knows the address must wait (before any token is
        looked at)."""
        known = self._known.get(address)
        seconds = wait_seconds(known, utcnow())
        if seconds > 0:
            self._saw(address, door, refused=True)
            raise Throttled(seconds)

    async def check_right_token(self, address: str, door: str) -> None:
        """The token was right: raise :class:`Throttled` all the same when the address must wait (set by
        another instance), so that the answer never tells a right token from a wrong one while it waits."""
        now = time.monotonic()
        checked = self._clear.get(address)
        if checked is not None and now - checked < CLEAR_FOR_SECONDS:
            return
        try:
            until_ms = await self.sign_in.blocked_until_ms(address)
        except DatabaseError:
            return  # nothing can be counted either while the database is away
        seconds = 0.0 if until_ms is None else until_ms / 1000 - time.time()
        if until_ms is not None and seconds > 0:
            # Waiting here too from now on, without looking again (the count is the database's).
            moment = utcnow()
            until = datetime.fromtimestamp(until_ms / 1000, UTC)
            self._remember(Failures(address, FREE_FAILURES + 1, moment, moment, until, alerted=True))
            self._saw(address, door, refused=True)
            raise Throttled(seconds)
        if len(self._clear) >= MAX_REMEMBERED:
            self._clear.clear()
        self._clear[address] = now

    async def wrong_token(self, address: str, door: str) -> float:
        """Count a wrong token from ``address``; the seconds it must now wait before the next one is checked
        (0: none). Raises :class:`Throttled` when it had to wait already (known to another instance)."""
        self._clear.pop(address, None)
        now = utcnow()
        try:
            counted = await self.sign_in.count_failure(address, now)
        except DatabaseError as exc:
            # The database is away: this instance counts on its own meanwhile.
            log.warning("admin.auth_failure_not_stored", reason=exc.reason)
            counted = after_failure(self._known.get(address), address, now)
        self._remember(counted.failures)
        if not counted.counted:
            self._saw(address, door, refused=True)
            raise Throttled(wait_seconds(counted.failures, now))
        self._saw(address, door, refused=False)
        if counted.burst:
            await self._tell(counted, door, now)
        return wait_seconds(counted.failures, now)

    async def signed_in(self, address: str) -> None:
        """The right token signed in from ``address``: its count starts again."""
        self._known.pop(address, None)
        await self.sign_in.forget(address)

    # --- telling a person -------------------------------------------------------------------------------

    async def _tell(self, counted: Counted, door: str, now: datetime) -> None:
        state = counted.failures
        seconds = (now - state.first_at).total_seconds()
        door_name = "console sign-in" if door == "console" else "API bearer token"
        message = (
            f"{state.failures} wrong admin tokens from {state.address} within {seconds:.0f} s "
            f"(the last at the {door_name}): each further try from it now waits longer before it is "
            f"checked, up to {BACKOFF_CAP_SECONDS:g} s, and tries made while it waits are answered 429. "
            "Someone guessing the token, or a client (a storefront, a script) with an old token: find it, "
            "or change the token if it may have leaked."
        )
        try:
            await self.runtime.alerts.raise_(Occurrence(Kind.ADMIN_AUTH_FAILURES, "admin", message))
        except DatabaseError as exc:
            log.warning("admin.auth_alert_not_stored", reason=exc.reason)

    def _saw(self, address: str, door: str, *, refused: bool) -> None:
        """Note a try for the window's summary line (one line a window, never one a try)."""
        self.runtime.metrics.admin_auth_failures.labels(door, "throttled" if refused else "wrong_token").inc()
        window = self._window
        if window is None:
            window = self._window = _Window(time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(SUMMARY_WINDOW_SECONDS, self.summarize)
        if refused:
            window.refused_unchecked[address] += 1
        else:
            window.failures[address] += 1
            window.doors[door] += 1

    def summarize(self) -> None:
        """Log the window's summary line and start a new window with the next try."""
        window, self._window = self._window, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if window is None:
            return
        addresses = window.failures + window.refused_unchecked
        shown = dict(addresses.most_common(MAX_ADDRESSES_SHOWN))
        log.warning(
            "admin.auth_failures",
            window_seconds=round(time.monotonic() - window.started, 1),
            wrong_tokens=sum(window.failures.values()),
            refused_unchecked=sum(window.refused_unchecked.values()),
            by_door={door: window.doors[door] for door in DOORS if window.doors[door]},
            addresses=len(addresses),
            top_addresses=shown,
            free_tries=FREE_FAILURES,
        )

    def close(self) -> None:
        """Log what the current window saw (the listener stops)."""
        self.summarize()

    def _remember(self, state: Failures) -> None:
        self._known[state.address] = state
        self._known.move_to_end(state.address)
        while len(self._known) > MAX_REMEMBERED:
            self._known.popitem(last=False)


THROTTLE = web.AppKey("procurd.sign_in_throttle", SignInThrottle)


def throttled_error_text(seconds: float) -> str:
    return (
        f"too many wrong admin tokens from this address: try again in {retry_after(seconds)} s "
        "(each further wrong token makes the wait longer)"
    )
