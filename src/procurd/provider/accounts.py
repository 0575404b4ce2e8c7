"""The provider's accounts and wallets: one entry for each thing an operator does to them (command line,
admin API, console), and the lookup the signed API authenticates with."""

from __future__ import annotations

import math
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import structlog

from procurd.config import MAX_ROTATION_OVERLAP_HOURS
from procurd.core.alerts import Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.orders import check_note, iso
from procurd.core.provider import (
    ACCOUNT_NAME_RULE,
    ACTIVE,
    DISABLED,
    Account,
    AmountError,
    OldSecret,
    account_view,
    cents_text,
    positive_cents,
    to_cents,
)
from procurd.core.records import LedgerEntry
from procurd.core.refusals import Refused
from procurd.db.views import WithProvider
from procurd.provider.ports import Installation

log = structlog.get_logger("procurd.provider")

ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CREDENTIAL_SECONDS = 1.0
KEY_PREFIX = "pk_"


def account_not_found(name: str) -> Refused:
    return Refused(404, "account_not_found", f"no provider account {name!r}")


@dataclass(frozen=True, slots=True)
class Rotation:
    """A rotated secret: the account, its new secret (shown this once), and when the previous one stops
    verifying (``None``: it stopped at once)."""

    account: Account
    api_secret: str = field(repr=False)
    old_valid_until: datetime | None


@dataclass(frozen=True, slots=True)
class Credentials:
    """What verifies an account's signatures: its secret, and its previous ones still in their overlap."""

    account: Account
    old_secrets: tuple[OldSecret, ...]


def _overlap(value: Any) -> float:
    """How long a previous secret stays valid, in hours: a number from 0 to a year (400
    ``invalid_overlap`` otherwise)."""
    hours: float | None = None
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        hours = float(value)
    elif isinstance(value, str):
        try:
            hours = float(value)
        except ValueError:
            hours = None
    if hours is None or not math.isfinite(hours) or not 0 <= hours <= MAX_ROTATION_OVERLAP_HOURS:
        raise Refused(
            400,
            "invalid_overlap",
            f"the overlap is a number of hours from 0 to {MAX_ROTATION_OVERLAP_HOURS} "
            "(0: the old secret ends now)",
        )
    return hours


def ledger_view(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "amount": cents_text(entry.amount_cents),
        "kind": entry.kind,
        "order_id": entry.order_id,
        "note": entry.note,
        "balance_after": cents_text(entry.balance_after_cents),
        "at": iso(entry.created_at),
    }


class ProviderAccountOperations:
    def __init__(self, runtime: Installation) -> None:
        self.runtime = runtime
        self.settings = runtime.settings.provider
        # Accounts the signed API looked up by key, for CREDENTIAL_SECONDS: each request would otherwise
        # read its account. A change made here clears it; one made by another process shows within that
        # time (an order is still refused at once: the state path checks the locked account row).
        self._by_key: dict[str, tuple[float, Credentials]] = {}

    async def add(self, name: str) -> tuple[Account, str]:
        """A new active account with an empty wallet: the account, and its API secret (shown once)."""
        if not isinstance(name, str) or not ACCOUNT_NAME.fullmatch(name):
            raise Refused(400, "invalid_account_name", f"an account name is {ACCOUNT_NAME_RULE}")
        api_key = KEY_PREFIX + secrets.token_hex(16)
        secret = secrets.token_hex(32)
        now = utcnow()

        def create(tx: WithProvider) -> Account | None:
            if tx.provider.account(name=name) is not None:
                return None
            created: Account = tx.provider.create_account(name, api_key, secret, self.settings.currency, now)
            return created

        account = await self.runtime.database.write(create)
        if account is None:
            raise Refused(409, "account_exists", f"a provider account named {name!r} exists already")
        log.info("provider.account_added", account=name, api_key=api_key)
        return account, secret

    async def get(self, name: str) -> Account:
        account = await self.runtime.database.read(lambda tx: tx.provider.account(name=name))
        if account is None:
            raise account_not_found(name)
        return account

    async def by_key(self, api_key: str) -> Credentials | None:
        """The account an API key names with its previous secrets still valid (the signed API's credential
        lookup), as they were at most :data:`CREDENTIAL_SECONDS` ago."""
        now = time.monotonic()
        cached = self._by_key.get(api_key)
        if cached is not None and cached[0] > now:
            return cached[1]

        def read(tx: WithProvider) -> Credentials | None:
            account = tx.provider.account(api_key=api_key)
            if account is None:
                return None
            old = tx.provider.old_secrets([account.id], utcnow()).get(account.id, [])
            return Credentials(account, tuple(old))

        found: Credentials | None = await self.runtime.database.read(read)
        if found is None:
            self._by_key.pop(api_key, None)  # unknown keys are not kept: strangers cannot grow this
        else:
            self._by_key[api_key] = (now + CREDENTIAL_SECONDS, found)
        return found

    async def old_secret_used(self, account: Account, secret_id: int) -> None:
        """A request of ``account`` was signed with a previous secret (inside its overlap): counted on the
        secret (its view shows how many, and the latest) and in ``procurd_provider_old_secret_requests``."""
        self.runtime.metrics.provider_old_secret_requests.labels(account.name).inc()
        await self.runtime.database.write(lambda tx: tx.provider.count_old_secret_use(secret_id, utcnow()))

    def _changed(self) -> None:
        self._by_key.clear()

    async def list(self) -> list[dict[str, Any]]:
        """Every account with its balance, level, orders by status and previous secrets, by name."""

        def read(
            tx: WithProvider,
        ) -> tuple[list[Account], dict[int, dict[str, int]], dict[int, list[OldSecret]]]:
            accounts = tx.provider.accounts()
            old = tx.provider.old_secrets([account.id for account in accounts], utcnow())
            return accounts, tx.provider.order_counts(), old

        accounts, counts, old = await self.runtime.database.read(read)
        return [
            account_view(account, counts.get(account.id, {}), old.get(account.id, [])) for account in accounts
        ]

    async def show(self, name: str, page: int = 1, page_size: int = 20) -> dict[str, Any]:
        """An account with a page of its ledger, the newest first."""
        account = await self.get(name)
        total, entries, counts, old = await self.runtime.database.read(
            lambda tx: (
                *tx.provider.ledger(account.id, page, page_size),
                tx.provider.order_counts(),
                tx.provider.old_secrets([account.id], utcnow()).get(account.id, []),
            )
        )
        view: dict[str, Any] = account_view(account, counts.get(account.id, {}), old)
        view["ledger"] = {
            "items": [ledger_view(entry) for entry in entries],
            "total": total,
            "page": page,
            "page_size": page_size,
        }
        return view

    async def set_status(self, name: str, active: bool) -> Account:
        """Enable or disable an account (a disabled account's requests answer 401 ``invalid_api_key``)."""
        account = await self.get(name)
        status = ACTIVE if active else DISABLED
        await self.runtime.database.write(
            lambda tx: tx.provider.update_account(account.id, utcnow(), status=status)
        )
        self._changed()
        log.info("provider.account_" + ("enabled" if active else "disabled"), account=name)
        return await self.get(name)

    async def rotate(self, name: str, overlap_hours: Any = None, *, end_now: bool = False) -> Rotation:
        """A new API secret for the account, shown once. The previous one keeps verifying its requests for
        ``overlap_hours`` (``[provider] rotation_overlap_hours`` by default), so that its downstream can
        switch without an outage; ``end_now`` (or an overlap of 0) ends every secret but the new one at once
        (a leaked secret). Callbacks are signed with the new secret from now on."""
        hours = self.settings.rotation_overlap_hours if overlap_hours is None else _overlap(overlap_hours)
        account = await self.get(name)
        secret = secrets.token_hex(32)
        now = utcnow()
        keep_until = None if end_now or hours == 0 else now + timedelta(hours=hours)
        await self.runtime.database.write(
            lambda tx: tx.provider.rotate_secret(account.id, secret, now, keep_until)
        )
        self._changed()
        log.info(
            "provider.account_secret_rotated",
            account=name,
            old_valid_until=keep_until.isoformat() if keep_until else None,
        )
        return Rotation(await self.get(name), secret, keep_until)

    async def set_level(self, name: str, slug: str | None) -> Account:
        """Give the account a price tier of ``[[provider.levels]]``, or none."""
        if slug is not None and self.settings.level(slug) is None:
            known = ", ".join(level.slug for level in self.settings.levels) or "none are configured"
            raise Refused(400, "unknown_level", f"no level {slug!r} in [[provider.levels]] ({known})")
        account = await self.get(name)
        await self.runtime.database.write(
            lambda tx: tx.provider.update_account(account.id, utcnow(), level=slug)
        )
        self._changed()
        log.info("provider.account_level_set", account=name, level=slug)
        return await self.get(name)

    async def move(self, name: str, amount: Any, note: Any, *, topup: bool) -> dict[str, Any]:
        """A movement by hand: a top-up, or a debit (refused 409 ``insufficient_balance`` when the wallet
        is short); its ledger row."""
        try:
            cents = positive_cents(amount)
        except AmountError as exc:
            raise Refused(400, "invalid_amount", str(exc)) from None
        text = check_note(note, required=True)
        account = await self.get(name)
        kind = "topup" if topup else "debit"
        now = utcnow()
        after = await self.runtime.database.write(
            lambda tx: tx.provider.move(account.id, cents if topup else -cents, kind, text, now)
        )
        if after is None:
            raise Refused(
                409,
                "insufficient_balance",
                f"the wallet of {name} holds {cents_text(account.balance_cents)} {account.currency}: "
                f"{cents_text(cents)} cannot be taken",
            )
        log.info(
            "provider.wallet_moved",
            account=name,
            kind=kind,
            amount=cents_text(cents),
            balance=cents_text(after),
        )
        await self.check_balance(account, after)
        return {"account": name, "kind": kind, "amount": cents_text(cents if topup else -cents),
                "balance": cents_text(after), "currency": account.currency, "note": text}  # fmt: skip

    async def check_balance(self, account: Account, balance_cents: int) -> None:
        """Alert ``provider_low_balance`` when the account's wallet is below ``[provider]
        low_balance_threshold``."""
        threshold = self.settings.low_balance_threshold
        if not threshold or balance_cents >= to_cents(threshold):
            return
        message = (
            f"the wallet of provider account {account.name} holds {cents_text(balance_cents)} "
            f"{account.currency}, below {threshold}: its orders are refused payment_failed once it cannot "
            f"pay them. Top it up: procurd provider topup {account.name} AMOUNT --note TEXT"
        )
        await self.runtime.alerts.raise_(Occurrence(Kind.PROVIDER_LOW_BALANCE, account.name, message))
