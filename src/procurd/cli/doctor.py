"""``procurd doctor``: is this installation ready to run? One line per check, ✔ or ✗ with what to do, and one
naming each upstream's dialect as its answers showed it (``procurd probe`` tells more).

Every check is an async function of the :class:`Examination` returning its :class:`Finding` list;
:data:`DOCTOR_CHECKS` is the list ``procurd doctor`` runs, in order. A new check is one more function
appended there. The exit code is 0 only when every finding is ✔.

The upstreams are checked with the installation's own signed ping (:mod:`procurd.operations`), through
the request budget every process shares; the clock offset is read from the ``Date`` of that signed answer.
That budget lives in the database, so the upstreams are checked once the database is usable.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from procurd.cli.base import CliState, common_options, main, pass_state, run_async
from procurd.cli.ping import failure_text
from procurd.config import ConfigError, Settings, UpstreamSettings
from procurd.core.offering import OfferFacts, low_accounts, rule_currencies, why_nothing_is_offered
from procurd.core.times import count
from procurd.operations import DatabaseError, InstallationError, check_database, open_operations
from procurd.operations.housekeeping import alert_url_problems
from procurd.operations.upstreams import (
    AuthError,
    Features,
    PingResult,
    UpstreamError,
    acg_faka_summary,
    dialect_text,
)
from procurd.output import echo

# The upstream refuses a request whose timestamp is more than 60 s off its clock; warn well before that.
CLOCK_TOLERANCE_SECONDS = 30.0


@dataclass(frozen=True)
class Finding:
    ok: bool
    subject: str
    detail: str
    fix: str = ""
    """What to do about it, when not ``ok`` (or a warning)."""
    warning: bool = False
    """Passes, but deserves a look (shown ⚠ with what to do; the exit code stays 0)."""


@dataclass
class Examination:
    """What the checks look at: the configuration as far as it loads."""

    settings: Settings | None
    """The whole configuration with its secrets read, when it loads."""
    database_settings: Settings | None
    """The configuration without its secret files (enough for the database), when that loads."""
    config_error: str | None
    database_ready: bool = False
    """Set by the database check: the upstream checks need the database (the request budget is there)."""
    upstream_currencies: dict[str, str] = field(default_factory=dict)
    """Set by the upstream checks: the currency each upstream answered its ping with."""


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


async def check_database_ready(exam: Examination) -> list[Finding]:
    settings = exam.database_settings
    if settings is None:
        return [Finding(False, "database", "not checked", "fix the configuration first")]
    found = await check_database(settings)
    exam.database_ready = found.ok
    return [Finding(found.ok, "database", found.detail, found.fix)]


async def check_upstreams(exam: Examination) -> list[Finding]:
    settings = exam.settings
    if settings is None or not exam.database_ready:
        source = exam.database_settings or settings
        names = [u.name for u in source.upstreams] if source else ["(all)"]
        fix = "fix the configuration first" if settings is None else "make the database usable first"
        return [Finding(False, f"upstream {name}", "not checked", fix) for name in names]
    findings: list[Finding] = []
    try:
        async with open_operations(settings) as operations:
            for upstream in settings.upstreams:
                outcome = await operations.upstreams.ping(upstream.name)
                findings += upstream_findings(upstream, outcome)
                if upstream.protocol == "acg-faka":
                    if isinstance(outcome, PingResult):
                        features = await operations.upstreams.features(upstream.name)
                        findings.append(version_finding(upstream, features))
                    continue
                learned = await operations.upstreams.dialect(upstream.name)
                findings.append(Finding(True, f"upstream {upstream.name} dialect", dialect_text(learned)))
                if isinstance(outcome, PingResult):
                    exam.upstream_currencies[upstream.name] = outcome.currency
    except (InstallationError, DatabaseError) as exc:
        reason = exc.message if isinstance(exc, InstallationError) else exc.reason
        findings.append(Finding(False, "upstreams", f"not checked: {reason}", "make the database usable"))
    return findings


def upstream_findings(upstream: UpstreamSettings, outcome: PingResult | UpstreamError) -> list[Finding]:
    """What a signed ping of ``upstream`` tells: authentication, balance, clock."""
    subject = f"upstream {upstream.name}"
    if isinstance(outcome, AuthError):
        return [Finding(False, subject, f"authentication failed: {outcome.code}", outcome.hint)]
    if isinstance(outcome, UpstreamError):
        fix = outcome.hint or f"check base_url {upstream.base_url} and that this machine can reach it"
        return [Finding(False, subject, f"no answer: {failure_text(outcome)}", fix)]
    site = f" at {outcome.site_name}" if outcome.site_name else ""
    speaks = f"{upstream.protocol}, {upstream.base_url}"
    findings = [Finding(True, subject, f"authenticated{site} ({speaks}), {outcome.latency_ms:.0f} ms")]
    balance = f"{outcome.balance} {outcome.currency}"
    if outcome.balance > 0:
        findings.append(Finding(True, f"{subject} balance", balance))
    else:
        fix = "top up the wallet of the API user: every purchase is paid from it"
        findings.append(Finding(False, f"{subject} balance", balance, fix))
    if upstream.protocol == "acg-faka":
        findings.append(Finding(True, f"{subject} clock", "not needed (acg-faka signs no time)"))
    else:
        findings.append(clock_finding(upstream, outcome.clock_offset_seconds))
    return findings


def version_finding(upstream: UpstreamSettings, features: Features | UpstreamError | None) -> Finding:
    """Which later endpoints an acg-faka supplier's version has; a warning when it has no ``query`` (it may
    not honour ``request_no``: a repeated trade could buy twice)."""
    subject = f"upstream {upstream.name} version"
    if isinstance(features, UpstreamError):
        return Finding(False, subject, f"not read: {failure_text(features)}", "run `procurd probe` again")
    if features is None:
        return Finding(True, subject, "not an acg-faka supplier")
    detail = acg_faka_summary(features)
    if not features.query:
        fix = (
            "ask the supplier to upgrade acg-faka (1.3.6 or later has query): an older shop may ignore "
            "request_no, and a lost trade answer cannot be looked up"
        )
        return Finding(True, subject, detail, fix, warning=True)
    return Finding(True, subject, detail)


def clock_finding(upstream: UpstreamSettings, offset: float | None) -> Finding:
    """The clock offset, from the Date header of the upstream's answer to the signed ping."""
    subject = f"upstream {upstream.name} clock"
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
    settings = exam.settings or exam.database_settings
    if settings is None:
        return []
    if not settings.alerts.urls:
        return [Finding(True, "alerts", "no [alerts] urls: alerts are recorded only (procurd alerts list)")]
    findings = []
    for shown, problem in await alert_url_problems(settings):
        if problem is None:
            findings.append(Finding(True, f"alerts {shown}", "reachable"))
        else:
            fix = "correct the URL in [alerts] urls or check the network (`procurd alerts test` sends one)"
            findings.append(Finding(False, f"alerts {shown}", problem, fix))
    return findings


async def check_provider(exam: Examination) -> list[Finding]:
    """With ``[provider] enabled``: products to offer (none is a failure naming the cause), the currency the
    pricing rules sell in, accounts (none yet: a warning) and wallets below the low-balance threshold."""
    settings = exam.settings
    if settings is None or not settings.provider.enabled:
        return []
    if not exam.database_ready:
        return [Finding(False, "provider", "not checked", "make the database usable first")]
    async with open_operations(settings) as operations:
        facts = await operations.provider.offer_facts()
        accounts = await operations.provider.accounts.list()
    return [
        offer_finding(facts),
        *currency_findings(settings, exam.upstream_currencies),
        *account_findings(settings, accounts),
    ]


def offer_finding(facts: OfferFacts) -> Finding:
    shortfall = why_nothing_is_offered(facts)
    if shortfall is not None:
        return Finding(False, "provider products", f"none to offer: {shortfall.cause}", shortfall.fix)
    return Finding(
        True,
        "provider products",
        f"{count(facts.sellable, 'SKU')} priced in {facts.currency} to offer "
        f"(of {count(facts.skus, 'SKU')} mirrored on sale)",
    )


def currency_findings(settings: Settings, upstream_currencies: Mapping[str, str]) -> list[Finding]:
    """What the pricing rules sell the offered upstreams' SKUs in, against ``[provider] currency``."""
    currency = settings.provider.currency
    rules = settings.pricing.compiled().rules
    found = rule_currencies(rules, settings.offered_upstreams(), upstream_currencies)
    if not found:
        return []  # no rule prices them: the products' finding says so
    subject = "provider pricing currency"
    fix = f'set currency = "{currency}" (and its exchange_rate) on the rule'
    others = [f for f in found if f.currency is not None and f.currency != currency]
    unknown = [f for f in found if f.currency is None]
    if len(others) == len(found):
        sold = ", ".join(f"#{f.rule} for {f.upstream} in {f.currency}" for f in others)
        return [Finding(False, subject, f"no pricing rule sells in {currency}: {sold}", fix + "s")]
    findings = []
    if others:
        sold = ", ".join(f"#{f.rule} for {f.upstream} in {f.currency}" for f in others)
        detail = f"rules selling in another currency than {currency}: {sold}; what they price is not offered"
        findings.append(Finding(True, subject, detail, fix + " if the provider should sell it", warning=True))
    if unknown:
        named = ", ".join(f"#{f.rule} for {f.upstream}" for f in unknown)
        detail = f"rules selling in the upstream's currency, not known (no successful ping): {named}"
        findings.append(Finding(True, subject, detail, "make the upstream's ping succeed", warning=True))
    if not findings:
        findings.append(Finding(True, subject, f"the pricing rules sell in {currency}"))
    return findings


def account_findings(settings: Settings, accounts: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Accounts (none yet: a warning) and the active ones below ``[provider] low_balance_threshold``."""
    if not accounts:
        return [
            Finding(True, "provider accounts", "none yet: no downstream site can buy",
                    "procurd provider account add NAME, then procurd provider topup NAME AMOUNT --note TEXT",
                    warning=True)
        ]  # fmt: skip
    disabled = sum(1 for account in accounts if account["status"] != "active")
    held = f" ({disabled} disabled)" if disabled else ""
    findings = [Finding(True, "provider accounts", f"{count(len(accounts), 'account')}{held}")]
    threshold = settings.provider.low_balance_threshold or None
    currency = settings.provider.currency
    if threshold is None:
        findings.append(
            Finding(True, "provider balances", "no [provider] low_balance_threshold: not watched")
        )
        return findings
    low = low_accounts(accounts, threshold)
    if low:
        named = ", ".join(f"{entry['name']} {entry['balance']} {currency}" for entry in low)
        findings.append(
            Finding(True, "provider balances", f"below {threshold} {currency}: {named}",
                    "ask the downstream to pay, then procurd provider topup NAME AMOUNT --note TEXT",
                    warning=True)
        )  # fmt: skip
    else:
        findings.append(
            Finding(True, "provider balances", f"every active account at {threshold} {currency} or more")
        )
    return findings


DOCTOR_CHECKS: list[DoctorCheck] = [
    check_configuration,
    check_database_ready,
    check_upstreams,
    check_provider,
    check_alert_urls,
]
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
    mark = "⚠" if finding.warning else "✔" if finding.ok else "✗"
    echo(f"{mark} {finding.subject}: {finding.detail}")
    if (finding.warning or not finding.ok) and finding.fix:
        echo(f"    → {finding.fix}")


@main.command()
@common_options
@pass_state
def doctor(state: CliState) -> None:
    """Check the configuration, the database (reachable, migrated) and each upstream (authentication,
    balance, clock); exit 0 only when every check passes."""
    findings = run_async(run_checks(examine(state)))
    failed = [finding for finding in findings if not finding.ok]
    warned = sum(1 for finding in findings if finding.warning)
    warnings = f" ({count(warned, 'warning')})" if warned else ""
    if failed:
        echo(f"{count(len(failed), 'check')} of {len(findings)} failed{warnings}")
        sys.exit(1)
    echo(f"all {count(len(findings), 'check')} passed{warnings}")
