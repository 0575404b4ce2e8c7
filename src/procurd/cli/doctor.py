"""``procurd doctor``: is this installation ready to run? One line per check, ✔ or ✗ with what to do.

Every check is an async function of the :class:`Examination` returning its :class:`Finding` list;
:data:`DOCTOR_CHECKS` is the list ``procurd doctor`` runs, in order. A new check (alert URLs reachable, say)
is one more function appended there. The exit code is 0 only when every finding is ✔.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from procurd.cli.base import CliState, common_options, main, pass_state, run_async
from procurd.config import ConfigError, Settings, UpstreamSettings
from procurd.output import count, echo

# The upstream refuses a request whose timestamp is more than 60 s off its clock; warn well before that.
CLOCK_TOLERANCE_SECONDS = 30.0


@dataclass(frozen=True)
class Finding:
    ok: bool
    subject: str
    detail: str
    fix: str = ""
    """What to do about it, when not ``ok``."""


@dataclass
class Examination:
    """What the checks look at: the configuration as far as it loads."""

    settings: Settings | None
    """The whole configuration with its secrets read, when it loads."""
    database_settings: Settings | None
    """The configuration without its secret files (enough for the database), when that loads."""
    config_error: str | None


DoctorCheck = Callable[[Examination], Awaitable[list[Finding]]]


async def check_configuration(exam: Examination) -> list[Finding]:
    if exam.config_error is not None:
        return [
            Finding(False, "configuration", exam.config_error.replace("\n", "; "),
                    "correct the keys named above (config.example.toml documents every key)")
        ]  # fmt: skip
    assert exam.settings is not None
    settings = exam.settings
    database = "PostgreSQL" if settings.database.url.startswith("postgresql") else "SQLite"
    where = settings.source or "the environment"
    findings = [
        Finding(True, "configuration", f"{where}: {count(len(settings.upstreams), 'upstream')}, {database}")
    ]
    problem = settings.server.callback_url_problem()
    if problem is not None:
        findings.append(
            Finding(False, "callback_url", f"{settings.server.callback_url}: {problem}",
                    "set [server] callback_url to the public https address of the callback receiver "
                    "(allow_private_callback_url = true only for a sandbox on this machine)")
        )  # fmt: skip
    return findings


async def check_database(exam: Examination) -> list[Finding]:
    from procurd.db.database import open_database, sqlite_file, sqlite_location_problem
    from procurd.db.errors import DatabaseError
    from procurd.db.revision import HEAD_REVISION, current_revision

    settings = exam.database_settings
    if settings is None:
        return [Finding(False, "database", "not checked", "fix the configuration first")]
    path = sqlite_file(settings.database.url)
    problem = None if path is None else sqlite_location_problem(path)
    if problem is not None:
        return [Finding(False, "database", problem, "correct [database] url")]
    fix = "check [database] url, and that the database server runs and accepts procurd"
    try:
        database = open_database(settings.database.url)
    except DatabaseError as exc:
        return [Finding(False, "database", f"cannot be used: {exc.reason}", fix)]
    try:
        current = await current_revision(database)
    except DatabaseError as exc:
        return [Finding(False, "database", f"cannot be used: {exc.reason}", fix)]
    finally:
        await database.close()
    if current != HEAD_REVISION:
        state = "empty" if current is None else f"at revision {current}"
        return [Finding(False, "database", f"{state}; this version needs revision {HEAD_REVISION}",
                        "run `procurd db upgrade`")]  # fmt: skip
    return [Finding(True, "database", f"reachable, at the current revision {HEAD_REVISION}")]


async def check_upstreams(exam: Examination) -> list[Finding]:
    settings = exam.settings
    if settings is None:
        names = [u.name for u in exam.database_settings.upstreams] if exam.database_settings else ["(all)"]
        return [
            Finding(False, f"upstream {name}", "not checked", "fix the configuration first") for name in names
        ]
    findings: list[Finding] = []
    for upstream in settings.upstreams:
        findings += await _check_upstream(upstream)
    return findings


async def _check_upstream(upstream: UpstreamSettings) -> list[Finding]:
    from procurd.upstream.client import UpstreamClient
    from procurd.upstream.errors import AuthError, UpstreamError

    subject = f"upstream {upstream.name}"
    async with UpstreamClient(upstream) as client:
        try:
            result = await client.ping()
        except AuthError as exc:
            return [Finding(False, subject, f"authentication failed: {exc.code}", exc.hint)]
        except UpstreamError as exc:
            fix = f"check base_url {upstream.base_url} and that this machine can reach it"
            return [Finding(False, subject, f"no answer: {exc}", fix)]
    site = f" at {result.site_name}" if result.site_name else ""
    findings = [
        Finding(True, subject, f"authenticated{site} ({upstream.base_url}), {result.latency_ms:.0f} ms")
    ]
    balance = f"{result.balance} {result.currency}"
    if result.balance > 0:
        findings.append(Finding(True, f"{subject} balance", balance))
    else:
        fix = "top up the wallet of the API user: every purchase is paid from it"
        findings.append(Finding(False, f"{subject} balance", balance, fix))
    findings.append(await _check_clock(upstream))
    return findings


async def _check_clock(upstream: UpstreamSettings) -> Finding:
    """The clock offset, from the Date header of the upstream's answer to a plain HEAD request."""
    import aiohttp

    from procurd.upstream.errors import clock_offset

    subject = f"upstream {upstream.name} clock"
    try:
        timeout = aiohttp.ClientTimeout(total=upstream.timeout_seconds)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.head(upstream.api_root) as answer,
        ):
            offset = clock_offset(time.time(), answer.headers.get("Date"))
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Finding(
            False, subject, f"not measured: {type(exc).__name__}", "check that the upstream is reachable"
        )
    if offset is None:
        return Finding(True, subject, "not measured (the upstream sends no Date header)")
    direction = "ahead of" if offset >= 0 else "behind"
    detail = f"this machine is {abs(offset):.0f} s {direction} the upstream"
    if abs(offset) > CLOCK_TOLERANCE_SECONDS:
        fix = "synchronise this machine's clock (NTP): the upstream refuses requests more than 60 s off"
        return Finding(False, subject, detail, fix)
    return Finding(True, subject, detail)


async def check_alert_urls(exam: Examination) -> list[Finding]:
    """Each ``[alerts] urls`` entry is a notification URL Apprise knows, and its host answers a connection
    (no message is sent: ``procurd alerts test`` sends one)."""
    from procurd.alerts import reachability, shown_url

    settings = exam.settings or exam.database_settings
    if settings is None:
        return []
    urls = settings.alerts.urls
    if not urls:
        return [Finding(True, "alerts", "no [alerts] urls: alerts are recorded only (procurd alerts list)")]
    findings = []
    for url, problem in zip(urls, await reachability(urls), strict=True):
        if problem is None:
            findings.append(Finding(True, f"alerts {shown_url(url)}", "reachable"))
        else:
            fix = "correct the URL in [alerts] urls or check the network (`procurd alerts test` sends one)"
            findings.append(Finding(False, f"alerts {shown_url(url)}", problem, fix))
    return findings


DOCTOR_CHECKS: list[DoctorCheck] = [check_configuration, check_database, check_upstreams, check_alert_urls]
"""What ``procurd doctor`` checks, in order; append a check here to add one."""


def examine(state: CliState) -> Examination:
    """Load the configuration as far as it goes: with its secrets, else without them."""
    try:
        settings = state.load(secrets=True)
        return Examination(settings, settings, None)
    except ConfigError as exc:
        error = str(exc)
    try:
        return Examination(None, state.load(secrets=False), error)
    except ConfigError:
        return Examination(None, None, error)


async def run_checks(exam: Examination) -> list[Finding]:
    findings: list[Finding] = []
    for check in DOCTOR_CHECKS:
        found = await check(exam)
        for finding in found:
            print_finding(finding)
        findings += found
    return findings


def print_finding(finding: Finding) -> None:
    echo(f"{'✔' if finding.ok else '✗'} {finding.subject}: {finding.detail}")
    if not finding.ok and finding.fix:
        echo(f"    → {finding.fix}")


@main.command()
@common_options
@pass_state
def doctor(state: CliState) -> None:
    """Check the configuration, the database (reachable, migrated) and each upstream (authentication,
    balance, clock); exit 0 only when every check passes."""
    findings = run_async(run_checks(examine(state)))
    failed = [finding for finding in findings if not finding.ok]
    if failed:
        echo(f"{count(len(failed), 'check')} of {len(findings)} failed")
        sys.exit(1)
    echo(f"all {count(len(findings), 'check')} passed")
