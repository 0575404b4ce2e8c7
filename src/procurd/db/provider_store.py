"""Statements of the provider role's accounts, wallets, orders and callbacks.

Wallet balances are integer cents, so that "never below zero" is a condition the database checks: a movement
by hand is one conditional ``UPDATE ... RETURNING``; the state path locks the accounts a batch concerns (in
id order, after the orders it locks) and writes the balances it decided.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    RowMapping,
    and_,
    bindparam,
    func,
    insert,
    literal,
    or_,
    select,
    type_coerce,
    update,
)

from procurd.core.provider import Account, OldSecret, ProviderOrder
from procurd.core.records import (
    IN_FLIGHT,
    CallbackAttempt,
    CallbackDue,
    CallbackState,
    LedgerEntry,
    SettledTry,
    unknown_outcome,
)
from procurd.db.bulk import inserted_ids
from procurd.db.keys import by_pairs
from procurd.db.provider_schema import (
    provider_accounts,
    provider_callback_attempts,
    provider_callbacks,
    provider_ledger,
    provider_old_secrets,
    provider_orders,
)
from procurd.db.schema import alerts


def to_account(row: RowMapping) -> Account:
    return Account(**{column.name: row[column.name] for column in provider_accounts.c})


def to_order(row: RowMapping) -> ProviderOrder:
    return ProviderOrder(**{column.name: row[column.name] for column in provider_orders.c})


_BY_DOWNSTREAM = select(provider_orders).where(
    provider_orders.c.account_id == bindparam("first"),
    provider_orders.c.downstream_order_no.in_(bindparam("seconds", expanding=True)),
)
_UPDATE_ORDER = (
    update(provider_orders)
    .where(provider_orders.c.order_no == bindparam("b_order_no"))
    .values(
        status=bindparam("status"),
        fulfillment=bindparam("fulfillment"),
        refunded_cents=bindparam("refunded_cents"),
        updated_at=bindparam("updated_at"),
    )
)
_WRITE_BALANCE = (
    update(provider_accounts)
    .where(provider_accounts.c.id == bindparam("b_id"))
    .values(balance_cents=bindparam("balance_cents"), updated_at=bindparam("updated_at"))
)


class ProviderStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- accounts ------------------------------------------------------------------------------------------

    def create_account(
        self, name: str, api_key: str, api_secret: str, currency: str, now: datetime
    ) -> Account:
        row = (
            self.connection.execute(
                insert(provider_accounts)
                .values(
                    name=name,
                    api_key=api_key,
                    api_secret=api_secret,
                    status="active",
                    level=None,
                    balance_cents=0,
                    currency=currency,
                    created_at=now,
                    updated_at=now,
                )
                .returning(*provider_accounts.c)
            )
            .mappings()
            .one()
        )
        return to_account(row)

    def account(
        self, *, name: str | None = None, api_key: str | None = None, id: int | None = None
    ) -> Account | None:
        if name is not None:
            condition = provider_accounts.c.name == name
        elif api_key is not None:
            condition = provider_accounts.c.api_key == api_key
        else:
            condition = provider_accounts.c.id == id
        row = self.connection.execute(select(provider_accounts).where(condition)).mappings().first()
        return None if row is None else to_account(row)

    def accounts(self) -> list[Account]:
        rows = self.connection.execute(
            select(provider_accounts).order_by(provider_accounts.c.name)
        ).mappings()
        return [to_account(row) for row in rows]

    def order_counts(self) -> dict[int, dict[str, int]]:
        """Per account, its orders by status."""
        statement = select(provider_orders.c.account_id, provider_orders.c.status, func.count()).group_by(
            provider_orders.c.account_id, provider_orders.c.status
        )
        counts: dict[int, dict[str, int]] = {}
        for account_id, status, number in self.connection.execute(statement):
            counts.setdefault(account_id, {})[status] = int(number)
        return counts

    def update_account(self, account_id: int, now: datetime, **values: Any) -> None:
        self.connection.execute(
            update(provider_accounts)
            .where(provider_accounts.c.id == account_id)
            .values(**values, updated_at=now)
        )

    # --- secrets rotated with an overlap --------------------------------------------------------------------

    def old_secrets(self, account_ids: Iterable[int], now: datetime) -> dict[int, list[OldSecret]]:
        """Per account, its previous secrets still valid at ``now``, the most recently replaced first."""
        wanted = sorted(set(account_ids))
        if not wanted:
            return {}
        statement = (
            select(provider_old_secrets)
            .where(provider_old_secrets.c.account_id.in_(wanted), provider_old_secrets.c.valid_until > now)
            .order_by(provider_old_secrets.c.account_id, provider_old_secrets.c.id.desc())
        )
        found: dict[int, list[OldSecret]] = {}
        for row in self.connection.execute(statement).mappings():
            secret = OldSecret(**{column.name: row[column.name] for column in provider_old_secrets.c})
            found.setdefault(secret.account_id, []).append(secret)
        return found

    def rotate_secret(self, account_id: int, secret: str, now: datetime, keep_until: datetime | None) -> None:
        """Give the account ``secret``; its current one stays valid until ``keep_until`` (``None``: it ends
        now, and so does every earlier one). Secrets whose overlap is over are forgotten."""
        locked = self.lock_accounts([account_id]).get(account_id)
        if locked is None:
            return
        ended = provider_old_secrets.c.account_id == account_id
        if keep_until is not None:
            ended = and_(ended, provider_old_secrets.c.valid_until <= now)
        self.connection.execute(provider_old_secrets.delete().where(ended))
        if keep_until is not None:
            kept = {"api_secret": locked.api_secret, "replaced_at": now, "valid_until": keep_until}
            self.connection.execute(
                insert(provider_old_secrets).values(
                    account_id=account_id, requests=0, last_used_at=None, **kept
                )
            )
        self.update_account(account_id, now, api_secret=secret)

    def count_old_secret_use(self, secret_id: int, now: datetime) -> None:
        """One more request verified by a previous secret."""
        self.connection.execute(
            update(provider_old_secrets)
            .where(provider_old_secrets.c.id == secret_id)
            .values(requests=provider_old_secrets.c.requests + 1, last_used_at=now)
        )

    def accounts_by_id(self, ids: Iterable[int]) -> dict[int, Account]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        rows = self.connection.execute(select(provider_accounts).where(provider_accounts.c.id.in_(wanted)))
        return {row["id"]: to_account(row) for row in rows.mappings()}

    def lock_accounts(self, ids: Iterable[int]) -> dict[int, Account]:
        """The accounts, locked for this transaction in id order (the state path locks them after the
        orders, so that two transactions never wait for each other)."""
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        statement = (
            select(provider_accounts)
            .where(provider_accounts.c.id.in_(wanted))
            .order_by(provider_accounts.c.id)
            .with_for_update()
        )
        return {row["id"]: to_account(row) for row in self.connection.execute(statement).mappings()}

    def move(
        self,
        account_id: int,
        cents: int,
        kind: str,
        note: str | None,
        now: datetime,
        *,
        order_id: int | None = None,
    ) -> int | None:
        """Add ``cents`` (negative: take) to the wallet unless that leaves it below zero, with its ledger row;
        the balance after, or ``None`` when the wallet is short."""
        balance = provider_accounts.c.balance_cents
        after = self.connection.execute(
            update(provider_accounts)
            .where(provider_accounts.c.id == account_id, balance + cents >= 0)
            .values(balance_cents=balance + cents, updated_at=now)
            .returning(balance)
        ).scalar_one_or_none()
        if after is None:
            return None
        self.insert_ledger(
            [
                {"account_id": account_id, "amount_cents": cents, "kind": kind, "order_id": order_id,
                 "note": note, "balance_after_cents": int(after), "created_at": now}
            ]
        )  # fmt: skip
        return int(after)

    def write_balances(self, balances: Mapping[int, int], now: datetime) -> None:
        """Store balances the state path decided on accounts it holds locked."""
        if balances:
            self.connection.execute(
                _WRITE_BALANCE,
                [
                    {"b_id": account_id, "balance_cents": cents, "updated_at": now}
                    for account_id, cents in balances.items()
                ],
            )

    def insert_ledger(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.connection.execute(insert(provider_ledger), list(rows))

    def ledger(self, account_id: int, page: int, page_size: int) -> tuple[int, list[LedgerEntry]]:
        """The account's wallet movements, the newest first."""
        total = self.connection.execute(
            select(func.count())
            .select_from(provider_ledger)
            .where(provider_ledger.c.account_id == account_id)
        ).scalar_one()
        rows = self.connection.execute(
            select(provider_ledger)
            .where(provider_ledger.c.account_id == account_id)
            .order_by(provider_ledger.c.id.desc())
            .limit(page_size)
            .offset((page - 1) * page_size)
        ).mappings()
        return int(total), [
            LedgerEntry(**{column.name: row[column.name] for column in provider_ledger.c}) for row in rows
        ]

    def ledger_totals(self) -> dict[int, int]:
        """Per account, the sum of its ledger (what its balance must equal)."""
        statement = select(provider_ledger.c.account_id, func.sum(provider_ledger.c.amount_cents)).group_by(
            provider_ledger.c.account_id
        )
        return {int(account_id): int(total or 0) for account_id, total in self.connection.execute(statement)}

    # --- orders --------------------------------------------------------------------------------------------

    def orders_by_downstream(self, keys: Iterable[tuple[int, str]]) -> dict[tuple[int, str], ProviderOrder]:
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        found = [to_order(row._mapping) for row in by_pairs(self.connection, _BY_DOWNSTREAM, wanted)]
        return {(order.account_id, order.downstream_order_no or ""): order for order in found}

    def orders_by_no(self, order_nos: Iterable[str]) -> dict[str, ProviderOrder]:
        wanted = sorted(set(order_nos))
        if not wanted:
            return {}
        rows = self.connection.execute(select(provider_orders).where(provider_orders.c.order_no.in_(wanted)))
        return {order.order_no: order for order in (to_order(row) for row in rows.mappings())}

    def orders_by_id(self, ids: Iterable[int]) -> dict[int, ProviderOrder]:
        wanted = sorted(set(ids))
        if not wanted:
            return {}
        rows = self.connection.execute(select(provider_orders).where(provider_orders.c.id.in_(wanted)))
        return {order.id: order for order in (to_order(row) for row in rows.mappings())}

    def order(self, order_id: int, account_id: int | None = None) -> ProviderOrder | None:
        conditions = [provider_orders.c.id == order_id]
        if account_id is not None:
            conditions.append(provider_orders.c.account_id == account_id)
        row = self.connection.execute(select(provider_orders).where(*conditions)).mappings().first()
        return None if row is None else to_order(row)

    def orders(
        self, account_id: int | None, status: str | None, page: int, page_size: int
    ) -> tuple[int, list[ProviderOrder]]:
        """Orders, the newest first (of one account, of one status)."""
        conditions = []
        if account_id is not None:
            conditions.append(provider_orders.c.account_id == account_id)
        if status is not None:
            conditions.append(provider_orders.c.status == status)
        total = self.connection.execute(
            select(func.count()).select_from(provider_orders).where(*conditions)
        ).scalar_one()
        rows = self.connection.execute(
            select(provider_orders)
            .where(*conditions)
            .order_by(provider_orders.c.id.desc())
            .limit(page_size)
            .offset((page - 1) * page_size)
        ).mappings()
        return int(total), [to_order(row) for row in rows]

    def insert_orders(self, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Insert new provider orders; their ids, in the order given."""
        if not rows:
            return []
        return inserted_ids(self.connection, provider_orders, rows, ("order_no",))

    def update_orders(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self.connection.execute(_UPDATE_ORDER, list(rows))

    def status_counts(self) -> dict[str, int]:
        statement = select(provider_orders.c.status, func.count()).group_by(provider_orders.c.status)
        return {status: int(number) for status, number in self.connection.execute(statement)}

    # --- callbacks ------------------------------------------------------------------------------------------

    def tell(self, order_ids_and_accounts: Sequence[tuple[int, int, str]], now: datetime) -> None:
        """A new status for each ``(order_id, account_id, status)`` to tell: pending from now, its tries
        counted afresh (a status not yet told is replaced by the newer one)."""
        if not order_ids_and_accounts:
            return
        wanted = sorted({order_id for order_id, _, _ in order_ids_and_accounts})
        known = set(
            self.connection.execute(
                select(provider_callbacks.c.order_id).where(provider_callbacks.c.order_id.in_(wanted))
            ).scalars()
        )
        fresh = {
            "pending": True, "attempts": 0, "first_attempt_at": None, "next_attempt_at": now,
            "delivered_at": None, "given_up_at": None, "last_error": None, "updated_at": now,
        }  # fmt: skip
        inserts, updates = [], []
        for order_id, account_id, status in order_ids_and_accounts:
            if order_id in known:
                updates.append({"b_order_id": order_id, "status": status, **fresh})
            else:
                inserts.append({"order_id": order_id, "account_id": account_id, "status": status, **fresh,
                                "lease_owner": None, "lease_expires_at": None})  # fmt: skip
                known.add(order_id)
        if inserts:
            self.connection.execute(insert(provider_callbacks), inserts)
        if updates:
            statement = (
                update(provider_callbacks)
                .where(provider_callbacks.c.order_id == bindparam("b_order_id"))
                .values({name: bindparam(name) for name in ("status", *fresh)})
            )
            self.connection.execute(statement, updates)

    def claim_callbacks(
        self, owner: str, now: datetime, lease_until: datetime, limit: int
    ) -> list[CallbackDue]:
        """Take callbacks that are due for ``owner`` until ``lease_until``."""
        due = (
            select(provider_callbacks.c.order_id)
            .where(
                provider_callbacks.c.pending.is_(True),
                provider_callbacks.c.next_attempt_at <= now,
                or_(provider_callbacks.c.lease_owner.is_(None), provider_callbacks.c.lease_expires_at < now),
            )
            .order_by(provider_callbacks.c.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        ids = list(self.connection.execute(due).scalars())
        if not ids:
            return []
        # A try left in flight by a claim that expired (its instance gone unnoticed): its outcome is unknown.
        self._mark_unknown(ids, "its claim expired before an answer was recorded")
        self.connection.execute(
            update(provider_callbacks)
            .where(provider_callbacks.c.order_id.in_(ids))
            .values(lease_owner=owner, lease_expires_at=lease_until)
        )
        rows = list(
            self.connection.execute(
                select(provider_callbacks).where(provider_callbacks.c.order_id.in_(ids))
            ).mappings()
        )
        # Each try is in the delivery log from now on, in flight until its answer settles it.
        tries = self.connection.execute(
            insert(provider_callback_attempts).returning(
                provider_callback_attempts.c.id, sort_by_parameter_order=True
            ),
            [
                {"order_id": row["order_id"], "at": now, "status": row["status"], "http_status": None,
                 "ok": False, "message": IN_FLIGHT, "replay": False}
                for row in rows
            ],
        )  # fmt: skip
        return [
            CallbackDue(
                row["order_id"],
                row["account_id"],
                row["status"],
                row["attempts"],
                row["first_attempt_at"],
                attempt_id,
            )
            for row, attempt_id in zip(rows, tries.scalars(), strict=True)
        ]

    def release_callbacks(self, instances: Sequence[str], now: datetime) -> list[int]:
        """The callbacks claimed by ``instances`` (found dead), free for another dispatcher at once; their
        tries in flight are marked ``outcome unknown`` in the delivery log. The orders concerned."""
        if not instances:
            return []
        callbacks = provider_callbacks.c
        ids = list(
            self.connection.execute(
                select(callbacks.order_id).where(callbacks.lease_owner.in_(list(instances))).with_for_update()
            ).scalars()
        )
        if not ids:
            return []
        gone = ", ".join(sorted(instances))
        self._mark_unknown(ids, f"the instance sending it ({gone}) stopped before its answer")
        self.connection.execute(
            update(provider_callbacks)
            .where(callbacks.order_id.in_(ids), callbacks.lease_owner.in_(list(instances)))
            .values(
                lease_owner=None,
                lease_expires_at=None,
                last_error=unknown_outcome("the instance sending it stopped before its answer"),
                updated_at=now,
            )
        )
        return ids

    def _mark_unknown(self, order_ids: Sequence[int], why: str) -> None:
        attempts = provider_callback_attempts.c
        self.connection.execute(
            update(provider_callback_attempts)
            .where(
                attempts.order_id.in_(list(order_ids)),
                attempts.http_status.is_(None),
                attempts.message == IN_FLIGHT,
            )
            .values(message=unknown_outcome(why))
        )

    def settle_callbacks(self, tries: Sequence[SettledTry], owner: str | None, now: datetime) -> None:
        """Log each try in its order's delivery log and settle its callback: delivered, given up, or retried
        at its ``next_attempt_at`` (tries under ``owner``'s claim); a replay (no owner) that failed is only
        logged. A newer status that arrived meanwhile stays pending. A few statements for the whole batch."""
        if not tries:
            return
        logged = [
            {"order_id": t.order_id, "at": now, "status": t.status, "http_status": t.http_status,
             "ok": t.delivered, "message": t.message, "replay": owner is None}
            for t in tries
            if t.attempt_id is None
        ]  # fmt: skip
        if logged:
            self.connection.execute(insert(provider_callback_attempts), logged)
        answered = [
            {"b_id": t.attempt_id, "at": now, "http_status": t.http_status, "ok": t.delivered,
             "message": t.message}
            for t in tries
            if t.attempt_id is not None
        ]  # fmt: skip
        if answered:
            # The try recorded in flight by its claim gets its answer (even when another instance, taking
            # over, marked it unknown meanwhile: now it is known).
            self.connection.execute(
                update(provider_callback_attempts)
                .where(provider_callback_attempts.c.id == bindparam("b_id"))
                .values({name: bindparam(name) for name in ("at", "http_status", "ok", "message")}),
                answered,
            )
        callbacks = provider_callbacks.c
        conditions = [
            callbacks.order_id == bindparam("b_order_id"),
            callbacks.status == bindparam("b_status"),
        ]
        if owner is not None:
            conditions.append(callbacks.lease_owner == owner)
        common: dict[str, Any] = {
            "attempts": callbacks.attempts + 1,
            "first_attempt_at": func.coalesce(
                callbacks.first_attempt_at, type_coerce(now, callbacks.first_attempt_at.type)
            ),
            "lease_owner": None,
            "lease_expires_at": None,
            "updated_at": now,
        }
        outcomes: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
            ({"pending": False, "delivered_at": now, "next_attempt_at": None, "last_error": None,
              "given_up_at": None}, []),
            ({"pending": False, "given_up_at": now, "next_attempt_at": None,
              "last_error": bindparam("error")}, []),
            ({"next_attempt_at": bindparam("next_at"), "last_error": bindparam("error")}, []),
        ]  # fmt: skip
        for t in tries:
            kind = 0 if t.delivered else 1 if t.gave_up else 2
            if kind == 2 and owner is None:
                continue  # a replay that failed is only logged: the callback's own schedule stays as it was
            outcomes[kind][1].append(
                {
                    "b_order_id": t.order_id,
                    "b_status": t.status,
                    "error": t.error,
                    "next_at": t.next_attempt_at,
                }
            )
        for values, rows in outcomes:
            if rows:
                statement = update(provider_callbacks).where(*conditions).values(**common, **values)
                self.connection.execute(statement, rows)
        if owner is not None:
            # A claim whose status was replaced meanwhile: let it go, the newer status is due now.
            self.connection.execute(
                update(provider_callbacks)
                .where(callbacks.order_id == bindparam("b_order_id"), callbacks.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None),
                [{"b_order_id": t.order_id} for t in tries],
            )

    def callback_state(self, order_id: int) -> CallbackState | None:
        row = (
            self.connection.execute(
                select(provider_callbacks).where(provider_callbacks.c.order_id == order_id)
            )
            .mappings()
            .first()
        )
        if row is None:
            return None
        return CallbackState(**{name: row[name] for name in CallbackState.__slots__})

    def attempts(self, order_id: int, limit: int = 100) -> list[CallbackAttempt]:
        """The order's callback tries, the newest first."""
        rows = self.connection.execute(
            select(provider_callback_attempts)
            .where(provider_callback_attempts.c.order_id == order_id)
            .order_by(provider_callback_attempts.c.id.desc())
            .limit(limit)
        ).mappings()
        return [
            CallbackAttempt(
                row["at"], row["status"], row["http_status"], row["ok"], row["message"], row["replay"]
            )
            for row in rows
        ]

    def next_callback_due(self) -> datetime | None:
        column = provider_callbacks.c.next_attempt_at
        value = self.connection.execute(
            select(type_coerce(func.min(column), column.type)).where(provider_callbacks.c.pending.is_(True))
        ).scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    def failing_callbacks(self, since: datetime) -> dict[int, tuple[int, int]]:
        """Per account: its callbacks still failing after first being tried before ``since``, and those given
        up; each only until the account's ``provider_callbacks_failing`` alert has been raised after it (a
        check that runs again does not count the same failure again)."""
        key = literal("provider_callbacks_failing:") + provider_accounts.c.name
        with_alert = provider_callbacks.join(
            provider_accounts, provider_accounts.c.id == provider_callbacks.c.account_id
        ).outerjoin(alerts, alerts.c.key == key)
        failing = (
            select(provider_callbacks.c.account_id, func.count())
            .select_from(with_alert)
            .where(
                provider_callbacks.c.pending.is_(True),
                provider_callbacks.c.attempts > 0,
                provider_callbacks.c.first_attempt_at <= since,
                or_(alerts.c.key.is_(None), alerts.c.last_at < provider_callbacks.c.first_attempt_at),
            )
            .group_by(provider_callbacks.c.account_id)
        )
        given_up = (
            select(provider_callbacks.c.account_id, func.count())
            .select_from(with_alert)
            .where(
                provider_callbacks.c.given_up_at.is_not(None),
                provider_callbacks.c.pending.is_(False),
                provider_callbacks.c.delivered_at.is_(None),
                or_(alerts.c.key.is_(None), alerts.c.last_at < provider_callbacks.c.given_up_at),
            )
            .group_by(provider_callbacks.c.account_id)
        )
        found: dict[int, tuple[int, int]] = {}
        for account_id, number in self.connection.execute(failing):
            found[int(account_id)] = (int(number), 0)
        for account_id, number in self.connection.execute(given_up):
            previous = found.get(int(account_id), (0, 0))
            found[int(account_id)] = (previous[0], int(number))
        return found

    def callback_counts(self) -> dict[str, int]:
        """Callbacks pending, failing (tried without success), given up."""
        pending = self.connection.execute(
            select(func.count()).select_from(provider_callbacks).where(provider_callbacks.c.pending.is_(True))
        ).scalar_one()
        failing = self.connection.execute(
            select(func.count())
            .select_from(provider_callbacks)
            .where(provider_callbacks.c.pending.is_(True), provider_callbacks.c.attempts > 0)
        ).scalar_one()
        given_up = self.connection.execute(
            select(func.count())
            .select_from(provider_callbacks)
            .where(
                and_(
                    provider_callbacks.c.given_up_at.is_not(None), provider_callbacks.c.delivered_at.is_(None)
                )
            )
        ).scalar_one()
        return {"pending": int(pending), "failing": int(failing), "given_up": int(given_up)}
