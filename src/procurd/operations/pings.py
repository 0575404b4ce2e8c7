"""Pings: an upstream asked about itself now, and what its answer says recorded (the health row, the wallet's
chart, the clock offset) with the alerts it calls for (``low_balance``, ``balance_runway``).

A ping from the command line, the daemon's schedule or ``procurd doctor`` is the same signed request through
the same budget, and records the same health row and alerts.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

import structlog

from procurd.config import UpstreamSettings
from procurd.core.alerts import Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.rollup import runway_hours, window_start
from procurd.db.database import Database
from procurd.db.views import WithCharts, WithDialects, WithHealth
from procurd.logs import scrub
from procurd.operations.runtime import Runtime
from procurd.upstream.errors import AuthError, UpstreamError, truncate
from procurd.upstream.models import PingResult

log = structlog.get_logger("procurd.status")


class PingTx(WithHealth, WithCharts, WithDialects, Protocol):
    """What recording a ping writes: the health row, the wallet's chart, what the dialect showed."""


async def record_ping(runtime: Runtime, upstream: str, outcome: PingResult | BaseException) -> None:
    """Store the outcome of a ping of ``upstream``.

    A success records the site, balance and latency and clears any pending authentication error; a failure
    keeps the last known balance and records the error (an authentication error also marks the upstream
    unhealthy until a later ping succeeds).
    """
    now = utcnow()
    values: dict[str, Any] = {"last_ping_at": now}
    if isinstance(outcome, PingResult):
        values.update(
            last_ping_ok=True,
            last_ping_error=None,
            site_name=outcome.site_name,
            protocol_version=outcome.protocol_version,
            balance=str(outcome.balance),
            currency=outcome.currency,
            member_level=outcome.member_level.to_json() if outcome.member_level is not None else None,
            latency_ms=round(outcome.latency_ms),
            auth_error_code=None,
            auth_error_at=None,
        )
    else:
        values.update(last_ping_ok=False, last_ping_error=describe_failure(outcome), latency_ms=None)
        if isinstance(outcome, AuthError):
            values.update(auth_error_code=outcome.code, auth_error_at=now)

    def record(tx: PingTx) -> None:
        tx.health.update(upstream, values, now)
        if isinstance(outcome, PingResult):  # the wallet's chart, hour by hour
            tx.charts.record_balance(upstream, str(outcome.balance), outcome.currency, now)
            if outcome.clock_offset_seconds is not None:
                tx.dialects.learn(upstream, {"clock_offset_seconds": outcome.clock_offset_seconds}, now)

    await runtime.database.write(record)
    await runtime.save_dialects()
    log.info(
        "upstream.ping_recorded",
        upstream=upstream,
        ok=values["last_ping_ok"],
        error=values.get("last_ping_error"),
    )


async def ping_upstream(runtime: Runtime, upstream: str) -> PingResult | UpstreamError:
    """Ping ``upstream`` now and record the outcome (what the daemon's ping job runs)."""
    try:
        result: PingResult | UpstreamError = await runtime.client(upstream).ping()
    except UpstreamError as exc:
        result = exc
    except Exception as exc:
        await record_ping(runtime, upstream, exc)
        raise
    await record_ping(runtime, upstream, result)
    if isinstance(result, PingResult):
        settings = runtime.settings.upstream(upstream)
        for check in (low_balance, balance_runway):
            found = await check(runtime.database, settings, result)
            if found is not None:
                await runtime.alerts.raise_(found)
    return result


def describe_failure(error: BaseException) -> str:
    """One line about a failure, without secrets (upstream errors already describe themselves safely).

    A failure that says what to check carries it: for an authentication failure the clock and its measured
    offset, for an endpoint the site does not serve the base_url.
    """
    if isinstance(error, UpstreamError) and error.hint:
        return truncate(f"{error}; {error.hint}", 400)
    if isinstance(error, UpstreamError):
        return truncate(str(error), 300)
    return truncate(scrub(f"{type(error).__name__}: {error}"), 300)


async def low_balance(
    database: Database, upstream: UpstreamSettings, ping: PingResult, now: datetime | None = None
) -> Occurrence | None:
    """A ``low_balance`` alert when the ping shows less than ``low_balance_threshold``; it says what was spent
    in the last 24 hours and how long the balance lasts at that rate."""
    if not upstream.low_balance_threshold:
        return None
    balance = Decimal(str(ping.balance))
    threshold = Decimal(upstream.low_balance_threshold)
    if balance >= threshold:
        return None
    since = window_start(now or utcnow())
    spent = await database.read(lambda tx: tx.charts.spend_since(upstream.name, since))
    currency = ping.currency or ""
    in_currency = spent.get(currency, Decimal(0))
    message = (
        f"{upstream.name}: the wallet holds {balance} {currency}, below the threshold of {threshold}; "
        f"spent in the last 24 h: {in_currency} {currency}"
    )
    if in_currency > 0:
        hours = balance / (in_currency / 24)
        message += f"; at that rate the balance lasts about {hours:.1f} h"
    message += ". Top up the upstream wallet."
    return Occurrence(Kind.LOW_BALANCE, upstream.name, message, upstream.name)


async def balance_runway(
    database: Database, upstream: UpstreamSettings, ping: PingResult, now: datetime | None = None
) -> Occurrence | None:
    """A ``balance_runway`` alert when, at the last 24 h's spend per hour, the wallet the ping shows lasts
    fewer than ``runway_alert_hours``; it says the balance, the spend and the hours left."""
    if upstream.runway_alert_hours == "":
        return None
    since = window_start(now or utcnow())
    spent = await database.read(lambda tx: tx.charts.spend_since(upstream.name, since))
    currency = ping.currency or ""
    balance = Decimal(str(ping.balance))
    in_currency = spent.get(currency, Decimal(0))
    hours = runway_hours(balance, in_currency)
    if hours is None or hours >= upstream.runway_alert_hours:
        return None
    rate = (in_currency / 24).quantize(Decimal("0.01"))
    message = (
        f"{upstream.name}: the wallet holds {balance} {currency}; the last 24 h spent {in_currency} "
        f"{currency} (about {rate} an hour), so it lasts about {hours:.1f} h, less than runway_alert_hours "
        f"({upstream.runway_alert_hours:g} h). Top up the upstream wallet."
    )
    return Occurrence(Kind.BALANCE_RUNWAY, upstream.name, message, upstream.name)
