"""Hostile input against the provider's signed API: hypothesis over real sockets.

A procurd daemon with ``[provider]`` on sells its mirror of a sandbox upstream. Random and adversarial
requests go to every endpoint under ``/api/v1/upstream``: bodies of every JSON shape and type, huge
numbers, NUL characters and lone surrogates (escaped, and raw as invalid UTF-8), deep nesting, bodies over
the provider's 1 MB limit, broken JSON, odd content types, query values of every kind, path ids that are not
numbers or overflow 64 bits. Most are correctly signed by a real account, so that they reach the endpoint;
some are not. Whatever arrives: never a 5xx, never a traceback in the log; every answer is the API's JSON
envelope with a documented error code and its status; nothing changes (accounts, balances, ledger,
provider orders, their callbacks, local orders and procurements) unless the request was a valid order, and
then it is one whole order and nothing else; no API secret reaches a log line or an answer.

The provider's rate limit is raised out of the way (it counts verified requests per account; a storm of
examples is not what it is for). ``PROCURD_HOSTILE_EXAMPLES`` sets the examples per test (100 by default).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import assume, event, given
from hypothesis import strategies as st
from multidict import CIMultiDict
from sqlalchemy import Table, select
from yarl import URL

from procurd.core.provider import price_cents
from procurd.daemon import Daemon
from procurd.db.provider_schema import (
    provider_accounts,
    provider_callback_attempts,
    provider_callbacks,
    provider_ledger,
    provider_orders,
)
from procurd.db.schema import orders, procurement_numbers, procurements
from procurd.protocol.dujiao.signing import HeaderNames, sign
from procurd.sandbox import Sandbox, SandboxConfig
from provider_support import ProviderSite, add_account, provider_settings
from support import captured_log, running_daemon, sql_rows, wait_until
from test_hostile_callbacks import (
    HOSTILE_JSON,
    HOSTILE_NUMBERS,
    ODD_STRINGS,
    Raw,
    hostile_settings,
    mutate,
    nested,
    to_bytes,
)
from test_provider_conformance import module_database_url, settled

__all__ = ["module_database_url"]  # a fixture of this module too

pytestmark = pytest.mark.asyncio(loop_scope="module")

EXAMPLES = int(os.environ.get("PROCURD_HOSTILE_EXAMPLES", "100"))
API = "/api/v1/upstream"
LIMIT = 1024 * 1024  # the provider's request body limit
TOP_SECRET = "hostile-top-secret-63b1f0"
AUTH_CODES = {"missing_auth_headers", "invalid_timestamp", "timestamp_expired", "invalid_signature",
              "invalid_api_key"}  # fmt: skip
# What each status may carry (INTERFACE "Provider", seed 000 part 7); 200 is ok, or payment_failed.
DOCUMENTED: dict[int, set[str]] = {
    200: {"payment_failed"},
    400: {"bad_request", "sku_unavailable", "product_unavailable", "invalid_callback_url"},
    401: AUTH_CODES,
    403: {"invalid_api_key"},
    404: {"not_found", "product_not_found", "product_unavailable", "order_not_found"},
    405: {"method_not_allowed"},
    409: {"insufficient_stock", "cancel_not_allowed"},
    413: {"request_too_large"},
}
QUERY_PARAMETERS = ("page", "page_size", "category_id", "updated_after")
STATE_TABLES: tuple[Table, ...] = (
    provider_accounts, provider_ledger, provider_orders, provider_callbacks, provider_callback_attempts,
    orders, procurements, procurement_numbers,
)  # fmt: skip


# --- the target -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    content_type: str
    headers: CIMultiDict[str]
    body: Any


Rows = dict[str, list[dict[str, Any]]]


@dataclass
class Target:
    """The provider's public listener, its accounts, its catalogue's ids, and what the examples did."""

    daemon: Daemon
    top: Sandbox
    base_url: str
    session: aiohttp.ClientSession
    log: io.StringIO
    accounts: dict[str, ProviderSite]
    skus: dict[str, int]
    order_ids: dict[str, int]  # orders made before the examples: delivered, held, foreign
    accepted: set[int] = field(default_factory=set)  # provider orders the examples created
    volatile: set[str] = field(default_factory=set)  # local orders whose procurements are still polled
    log_offset: int = 0
    last: Rows | None = None  # the rows read last

    @property
    def secrets(self) -> list[str]:
        return [TOP_SECRET, *(site.api_secret for site in self.accounts.values())]

    def headers(
        self, account: str, method: str, path: str, body: bytes, stamp: int | None = None
    ) -> list[tuple[str, str]]:
        """The three signature headers of ``account`` over ``method``, the raw ``path`` and ``body``."""
        site = self.accounts[account]
        names = HeaderNames.for_prefix(site.header_prefix)
        stamp = int(time.time()) if stamp is None else stamp
        signature = sign(site.api_secret, method, path, stamp, body)
        return [(names.api_key, site.api_key), (names.timestamp, str(stamp)), (names.signature, signature)]

    async def send(
        self, method: str, target: str, body: bytes = b"", headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        """One request exactly as given: ``target`` is the encoded path and query."""
        data: bytes | io.BytesIO = io.BytesIO(body) if len(body) > 64 * 1024 else body
        async with self.session.request(
            method, URL(self.base_url + target, encoded=True), data=data, headers=CIMultiDict(list(headers))
        ) as response:
            text = await response.text(errors="replace")
            try:
                parsed: Any = json.loads(text, parse_float=Decimal)
            except ValueError:
                parsed = None
            return Reply(response.status, text, response.content_type, CIMultiDict(response.headers), parsed)

    async def signed(
        self, method: str, path: str, query: str = "", body: bytes = b"", account: str = "main",
        extra: Sequence[tuple[str, str]] = (),
    ) -> Reply:  # fmt: skip
        headers = [*self.headers(account, method, path, body), *extra]
        return await self.send(method, path + (f"?{query}" if query else ""), body, headers)

    async def rows(self) -> Rows:
        """Every row of the tables a request or an order writes, as dicts, in key order (one read)."""

        def read(tx: Any) -> Rows:
            return {
                table.name: [
                    dict(row._mapping)
                    for row in tx.connection.execute(select(table).order_by(*table.primary_key.columns))
                ]
                for table in STATE_TABLES
            }

        self.last = await self.daemon.runtime.database.read(read)
        return self.last

    async def before(self) -> Rows:
        """The rows before a request: those read after the previous one (what changed since by itself is
        left out of every comparison), or read now."""
        return self.last if self.last is not None else await self.rows()

    def settled_view(self, rows: Rows) -> Rows:
        """``rows`` without what may change by itself: the rows of the orders the examples created (they
        are bought, delivered, told to their downstream in the background), the procurements still polled,
        and each account's balance and time of change (checked against its ledger instead)."""
        accepted = self.accepted
        mine = {row["order_no"] for row in rows["provider_orders"] if row["id"] in accepted}
        local = mine | self.volatile
        bought = {row["id"] for row in rows["procurements"] if row["order_no"] in local}
        keep: dict[str, Callable[[dict[str, Any]], bool]] = {
            "provider_accounts": lambda row: True,
            "provider_ledger": lambda row: row["order_id"] not in accepted,
            "provider_orders": lambda row: row["id"] not in accepted,
            "provider_callbacks": lambda row: row["order_id"] not in accepted,
            "provider_callback_attempts": lambda row: row["order_id"] not in accepted,
            "orders": lambda row: row["order_no"] not in local,
            "procurements": lambda row: row["order_no"] not in local,
            "procurement_numbers": lambda row: row["procurement_id"] not in bought,
        }
        view: Rows = {name: [row for row in table if keep[name](row)] for name, table in rows.items()}
        view["provider_accounts"] = [
            {k: v for k, v in row.items() if k not in ("balance_cents", "updated_at")}
            for row in view["provider_accounts"]
        ]
        return view

    def new_log_lines(self) -> list[str]:
        text = self.log.getvalue()
        fresh, self.log_offset = text[self.log_offset :], len(text)
        return [line for line in fresh.splitlines() if line.strip()]

    def assert_quiet(self, reply: Reply | None = None) -> None:
        """No secret in the log lines written since the last check nor in ``reply``; every line is one JSON
        object without a traceback."""
        for line in self.new_log_lines():
            assert not [s for s in self.secrets if s in line], f"a secret in the log: {line[:300]}"
            record = json.loads(line)
            assert isinstance(record, dict), line[:300]
            assert "exception" not in record, line[:600]
            assert record.get("event") != "protocol.request_failed", line[:600]
        if reply is not None:
            assert not [s for s in self.secrets if s in reply.text], reply.text[:300]


def assert_balances_follow_ledgers(rows: Rows) -> None:
    """Every wallet holds what its ledger adds up to."""
    for account in rows["provider_accounts"]:
        moved = sum(
            row["amount_cents"] for row in rows["provider_ledger"] if row["account_id"] == account["id"]
        )
        assert account["balance_cents"] == moved, account["name"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(module_database_url: str) -> AsyncIterator[Target]:
    """A provider over a sandbox (auto, manual and scarce products), accounts ``main`` (a wallet of
    1,000,000), ``other`` and ``disabled``; orders made beforehand: ``delivered`` and ``held`` (paid,
    undelivered upstream) of ``main``, ``foreign`` of ``other``; the log captured at debug level."""
    config = SandboxConfig(
        api_key="hostile-top-key", api_secret=TOP_SECRET, products=3, skus_per_product=2, manual_ratio=0.0,
        balance=Decimal("100000000.00"), allow_private_callbacks=True, callback_retry_delays=(),
    )  # fmt: skip
    with ExitStack() as stack:
        log = stack.enter_context(captured_log("debug"))
        async with Sandbox(config) as top:
            state = top.state
            plain = state.add_product(price="9.90", title="Plain card")
            manual = state.add_product(fulfillment_type="manual", price="3.00", title="Manual top-up")
            scarce = state.add_product(price="5.00", stock_quantity=1, title="Scarce card")
            settings = provider_settings(
                module_database_url, ("top", top),
                provider={"allow_private_callback_url": False, "rate_limit_per_minute": 100_000},
            )  # fmt: skip
            async with running_daemon(settings) as daemon, aiohttp.ClientSession() as session:
                await settled(daemon)
                operations = daemon.operations
                accounts = {
                    "main": await add_account(operations, "main", balance="1000000.00"),
                    "other": await add_account(operations, "other"),
                    "disabled": await add_account(operations, "disabled"),
                }
                await operations.provider.accounts.set_status("disabled", False)
                skus = {
                    "plain": state.product(plain).skus[0].id,
                    "manual": state.product(manual).skus[0].id,
                    "scarce": state.product(scarce).skus[0].id,
                    "generated": state.product(min(state.products)).skus[0].id,
                }
                base_url = f"http://127.0.0.1:{settings.server.public_port}"
                found = Target(daemon, top, base_url, session, log, accounts, skus, {})
                await _prepare(found)
                yield found


async def _prepare(target: Target) -> None:
    async def create(account: str, number: str) -> dict[str, Any]:
        body = json.dumps({"sku_id": target.skus["plain"], "quantity": 1, "downstream_order_no": number})
        reply = await target.signed("POST", API + "/orders", body=body.encode(), account=account)
        assert reply.status == 200, reply.text
        return dict(reply.body)

    delivered = await create("main", "SETUP-DELIVERED")

    async def status_of(order_id: int) -> str | None:
        reply = await target.signed("GET", f"{API}/orders/{order_id}")
        return str(reply.body["status"]) if reply.body["status"] == "delivered" else None

    await wait_until(lambda: status_of(delivered["order_id"]), timeout=15)
    await wait_until(lambda: _no_queued(target), timeout=10)
    target.top.faults.hold_delivery_next()
    held = await create("main", "SETUP-HELD")
    await wait_until(lambda: _no_queued(target), timeout=10)
    foreign = await create("other", "SETUP-FOREIGN")
    await wait_until(lambda: status_of_other(target, foreign["order_id"]), timeout=15)
    target.order_ids = {"delivered": delivered["order_id"], "held": held["order_id"],
                        "foreign": foreign["order_id"]}  # fmt: skip
    target.volatile.add(held["order_no"])  # paid upstream, undelivered: polled
    target.assert_quiet()


async def _no_queued(target: Target) -> bool:
    queued = select(procurements.c.id).where(procurements.c.state == "queued")
    return not await sql_rows(target.daemon.runtime.database, queued)


async def status_of_other(target: Target, order_id: int) -> bool:
    reply = await target.signed("GET", f"{API}/orders/{order_id}", account="other")
    return bool(reply.body["status"] == "delivered")


# --- what every answer must be ----------------------------------------------------------------------------


def assert_documented(reply: Reply, allowed: Mapping[int, set[str]] = DOCUMENTED) -> None:
    """Below 500; the API's JSON envelope: ``{"ok": true, ...}``, or ``{"ok": false, "error_code",
    "error_message"}`` with a code documented for that status; a ``Date`` header."""
    assert reply.status < 500, (reply.status, reply.text[:300])
    assert reply.content_type == "application/json", (reply.status, reply.content_type, reply.text[:200])
    assert isinstance(reply.body, dict), reply.text[:300]
    assert "Date" in reply.headers
    if reply.status == 200 and reply.body.get("ok") is True:
        return
    assert reply.body.get("ok") is False, reply.text[:300]
    code = reply.body.get("error_code")
    assert code in allowed.get(reply.status, set()), (reply.status, reply.text[:300])
    assert isinstance(reply.body.get("error_message"), str), reply.text[:300]
    assert reply.body["error_message"], reply.text[:300]


def reached_the_endpoint(reply: Reply, body: bytes) -> None:
    """A correctly signed request is never refused for its signature (only for its size first)."""
    if len(body) > LIMIT:
        assert (reply.status, reply.body["error_code"]) == (413, "request_too_large"), reply.text[:300]
        return
    assert reply.body.get("error_code") not in AUTH_CODES, reply.text[:300]


async def check_unchanged(target: Target, before: Rows) -> Rows:
    after = await target.rows()
    assert target.settled_view(after) == target.settled_view(before)
    assert_balances_follow_ledgers(after)
    return after


# --- strategies -------------------------------------------------------------------------------------------

SHORT_TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(ODD_STRINGS),
    st.text(
        st.characters(codec=None, categories=["Cs", "Cc", "Cf", "Zs", "So", "Nd"]), min_size=1, max_size=6
    ),
)
NUMBER_TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["0", "-0", "007", "1e3", "1.0", " 1", "1 ", "+1", "0x10", "１２", "٣", str(2**63 - 1),
                     str(2**63), str(2**64), "9" * 19, "9" * 400, "9" * 5000]),
)  # fmt: skip
INSTANTS = st.sampled_from([
    "2026-01-02T03:04:05Z", "2026-01-02T03:04:05+08:00", "2026-01-02T03:04:05.123456-05:00",
    "0001-01-01T00:00:00+14:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-14:00", "9999-12-31T23:59:59Z",
    "2026-01-02T03:04:05", "2026-01-02", "2026-02-30T00:00:00Z", "2026-01-02T03:04:05+24:00", "now",
])  # fmt: skip
QUERY_VALUES = st.one_of(NUMBER_TEXT, INSTANTS, SHORT_TEXT)
CONTENT_TYPES = st.sampled_from([
    "application/json", "application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/json; charset=utf-16", "image/png", "", "a/b; c=\"d",
])  # fmt: skip


def encoded(text: str) -> str:
    """``text`` percent-encoded as UTF-8 (a lone surrogate becomes bytes that are not UTF-8)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def queries(draw: st.DrawFn) -> str:
    """A query string: the documented parameters and others, repeated, with values of every kind, and
    now and then a raw fragment no encoder writes."""
    pairs = draw(
        st.lists(st.tuples(st.sampled_from(QUERY_PARAMETERS) | SHORT_TEXT, QUERY_VALUES), max_size=5)
    )
    parts = [f"{encoded(key)}={encoded(value)}" for key, value in pairs]
    parts += draw(st.lists(st.sampled_from(["%ZZ", "page=%", "page", "=1", "&", ";", "page=1;page_size=2",
                                            "updated_after=2026-01-02T03:04:05+08:00", "%ED%A0%80=1"]),
                           max_size=2))  # fmt: skip
    query = "&".join(draw(st.permutations(parts)))
    assume(len(query) < 6000)  # longer request lines are the HTTP parser's to refuse, before any route
    return query


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A body an endpoint that takes none may be sent anyway: nothing, JSON of any shape, or bytes."""
    return draw(
        st.sampled_from([b"", b"", b"{}", b"null", b"\x00", b"\xff\xfe\xfd"])
        | HOSTILE_JSON.map(to_bytes)
        | st.binary(max_size=64)
    )


@st.composite
def path_ids(draw: st.DrawFn, known: Sequence[int]) -> str:
    """One path segment, encoded: a known id, a number of any size, or any text."""
    raw = draw(st.sampled_from([str(i) for i in known]) | NUMBER_TEXT | SHORT_TEXT)
    assume(raw not in (".", ".."))
    return encoded(raw)


# --- the properties ---------------------------------------------------------------------------------------


async def send_and_check(target: Target, method: str, path: str, query: str, body: bytes,
                         content_type: str, allowed: Mapping[int, set[str]]) -> Reply:  # fmt: skip
    """A correctly signed request of ``main``: a documented answer, the endpoint reached, nothing changed."""
    before = await target.before()
    extra = [("Content-Type", content_type)] if content_type else []
    reply = await target.signed(method, path, query, body, extra=extra)
    assert_documented(reply, allowed)
    reached_the_endpoint(reply, body)
    await check_unchanged(target, before)
    target.assert_quiet(reply)
    return reply


@hostile_settings(EXAMPLES)
@given(data=st.data())
async def test_ping_and_categories_whatever_they_carry(target: Target, data: st.DataObject) -> None:
    """POST /ping and GET /categories with any body, query and content type: the account's ping or the
    categories, or 413 past the body limit; nothing changes."""
    method, path = data.draw(st.sampled_from([("POST", "/ping"), ("GET", "/categories")]), label="endpoint")
    body = data.draw(bodies(), label="body")
    query = data.draw(queries(), label="query")
    reply = await send_and_check(
        target, method, API + path, query, body, data.draw(CONTENT_TYPES), DOCUMENTED
    )
    if reply.status == 200 and path == "/ping":
        assert (reply.body["protocol_version"], reply.body["currency"]) == ("1.0", "CNY")
    elif reply.status == 200:
        assert isinstance(reply.body["categories"], list)
    else:
        assert (reply.status, reply.body["error_code"]) == (413, "request_too_large")


@hostile_settings(EXAMPLES)
@given(data=st.data())
async def test_product_listing_with_any_query(target: Target, data: st.DataObject) -> None:
    """GET /products with query values of every kind: a page whose ``page`` is at least 1 and
    ``page_size`` 1 to 100, or 400 ``bad_request`` naming the parameter; nothing changes."""
    query = data.draw(queries(), label="query")
    reply = await send_and_check(target, "GET", API + "/products", query, b"", "", {400: {"bad_request"}})
    if reply.status == 200:
        page, size, total = reply.body["page"], reply.body["page_size"], reply.body["total"]
        assert isinstance(page, int), reply.text[:200]
        assert isinstance(size, int), reply.text[:200]
        assert isinstance(total, int), reply.text[:200]
        assert page >= 1, reply.text[:200]
        assert 1 <= size <= 100, reply.text[:200]
        assert len(reply.body["items"]) <= size, reply.text[:200]
    else:
        message = reply.body["error_message"]
        assert any(name in message for name in QUERY_PARAMETERS), message


EDGE_VALUES = (
    "0", "-1", "1", "100", "101", str(2**31), str(2**62), str(2**63 - 1), str(2**63), str(2**64),
    "1" + "0" * 30, "9" * 4000, "1.5", "1e3", "", " ", "\x00", "\ud800", "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-14:00", "9999-12-31T23:59:59.999999Z", "NaN",
)  # fmt: skip


async def test_every_edge_value_of_every_listing_parameter(target: Target) -> None:
    """Each edge value (64-bit bounds and past them, huge, negative, empty, NUL, a lone surrogate, the first
    and last instants in any zone) in each GET /products parameter, alone and with a page size: a page
    or 400 ``bad_request`` naming the parameter; nothing changes."""
    failures: list[str] = []
    for name in QUERY_PARAMETERS:
        for value in EDGE_VALUES:
            for extra in ("", "&page_size=100"):
                query = f"{name}={encoded(value)}{extra}"
                try:
                    reply = await send_and_check(
                        target, "GET", API + "/products", query, b"", "", {400: {"bad_request"}}
                    )
                    if reply.status == 400:
                        assert name in reply.body["error_message"], reply.text[:200]
                except AssertionError as error:
                    failures.append(f"{query[:80]}: {str(error).splitlines()[0][:200]}")
    assert not failures, "\n".join(failures)


PATHS = {
    "product": ("GET", "/products/{}"),
    "order": ("GET", "/orders/{}"),
    "cancel": ("POST", "/orders/{}/cancel"),
}


@hostile_settings(EXAMPLES)
@given(data=st.data())
async def test_path_ids_of_every_kind(target: Target, data: st.DataObject) -> None:
    """GET /products/{id}, GET /orders/{id} and POST /orders/{id}/cancel with ids that are known, unknown,
    another account's, negative, not numbers, longer than 64 bits, or any text: the product or order, 400
    ``bad_request``, 404, or 409 ``cancel_not_allowed``; nothing changes."""
    kind = data.draw(st.sampled_from(sorted(PATHS)), label="endpoint")
    method, template = PATHS[kind]
    known = [
        *target.order_ids.values(),
        *target.accepted,
        *target.skus.values(),
        *list(target.top.state.products),
    ]
    segment = data.draw(path_ids(known), label="id")
    body = data.draw(st.just(b"") | bodies(), label="body")
    reply = await send_and_check(target, method, API + template.format(segment), "", body, "", DOCUMENTED)
    if reply.status == 200:
        assert kind == "product" or reply.body["order_id"] in {
            target.order_ids["delivered"],
            target.order_ids["held"],
            *target.accepted,
        }
    if kind == "cancel" and reply.status == 200:
        assert reply.body["order_id"] in target.accepted, reply.text[:300]


def order_fields(target: Target) -> st.SearchStrategy[dict[str, Any]]:
    skus = st.sampled_from([*target.skus.values(), 987_654, 0]) | HOSTILE_NUMBERS
    return st.fixed_dictionaries(
        {
            "sku_id": skus,
            "quantity": st.integers(1, 3) | st.sampled_from([0, -1, 100_001, 2**63]) | HOSTILE_NUMBERS,
            "downstream_order_no": st.integers(0, 40).map(lambda n: f"H-{n}")
            | st.sampled_from(["SETUP-DELIVERED", "SETUP-HELD", "SETUP-FOREIGN", "", "x" * 128, "x" * 129])
            | SHORT_TEXT
            | st.none(),
            "trace_id": st.none() | SHORT_TEXT | st.just("t" * 129),
            "callback_url": st.none() | st.sampled_from([
                "https://downstream.invalid/cb", "http://127.0.0.1:9/cb", "http://[::1]/x", "http://10.1.2.3/",
                "ftp://downstream.invalid/", "http://", "https://downstream.invalid/" + "a" * 3000,
            ]) | SHORT_TEXT,
            "manual_form_data": st.none() | st.just({"account": "player-1"}) | HOSTILE_JSON,
        },
    )  # fmt: skip


def valid_orders(target: Target) -> st.SearchStrategy[dict[str, Any]]:
    """An order the provider takes: an offered SKU, a small quantity, a number (new or seen), now and then a
    trace id and a public callback URL; the form for the manual product."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        role = draw(st.sampled_from(["plain", "generated", "manual", "scarce"]))
        fields: dict[str, Any] = {
            "sku_id": target.skus[role],
            "quantity": draw(st.integers(1, 2)),
            "downstream_order_no": draw(st.integers(0, 10**6).map(lambda n: f"V-{n}")),
        }
        if draw(st.booleans()):
            fields["trace_id"] = draw(st.text("abcdef0123456789-", max_size=32))
        if draw(st.booleans()):
            fields["callback_url"] = "https://downstream.invalid/cb"
        if role == "manual":
            fields["manual_form_data"] = {"account": draw(st.sampled_from(["player-1", "玩家", "a b"]))}
        return fields

    return build()


@st.composite
def order_bodies(draw: st.DrawFn, target: Target) -> bytes:
    """A POST /orders body: valid, with hostile fields (dropped when None), mutated, other JSON, or broken."""
    shape = draw(st.sampled_from(["valid", "valid", "order", "order", "mutated", "other_json", "broken"]))
    ascii_only = draw(st.booleans())
    if shape == "valid":
        return to_bytes(draw(valid_orders(target)), ascii_only)
    fields = {k: v for k, v in draw(order_fields(target)).items() if v is not None}
    if shape == "order":
        return to_bytes(fields, ascii_only)
    if shape == "mutated":
        return to_bytes(mutate(draw, draw(valid_orders(target))), ascii_only)
    if shape == "other_json":
        return to_bytes(draw(HOSTILE_JSON), ascii_only)
    valid = to_bytes(fields)
    return draw(
        st.sampled_from([b"", b"\xef\xbb\xbf" + valid, valid[: len(valid) // 2], valid + b"x", b"\xff\xfe",
                         valid.replace(b"}", b",}"), nested(100_000, "array").text.encode()])
        | st.binary(max_size=64)
    )  # fmt: skip


def assert_whole_order(target: Target, before: Rows, after: Rows, reply: Reply, body: bytes) -> None:
    """A new order: one provider order of ``main`` at quantity x its unit price, charged once (or
    canceled uncharged when payment failed), taken in for procurement under its own number."""
    answer = reply.body
    order_id = answer["order_id"]
    assert order_id not in {row["id"] for row in before["provider_orders"]}
    created = [row for row in after["provider_orders"] if row["id"] == order_id]
    assert len(created) == 1
    order = created[0]
    main_id = next(row["id"] for row in after["provider_accounts"] if row["name"] == "main")
    assert order["account_id"] == main_id
    assert order["amount_cents"] == order["quantity"] * price_cents(order["unit_price"])
    sent = json.loads(body)
    assert order["quantity"] == sent["quantity"]
    charged = [
        row for row in after["provider_ledger"] if row["order_id"] == order_id and row["kind"] == "order"
    ]
    if answer["ok"]:
        assert answer["status"] == "paid", answer
        assert Decimal(answer["amount"]) * 100 == order["amount_cents"]
        assert [row["amount_cents"] for row in charged] == [-order["amount_cents"]]
        assert [row["order_no"] for row in after["orders"] if row["order_no"] == order["order_no"]] == [
            order["order_no"]
        ]
    else:
        assert (answer["error_code"], answer["status"]) == ("payment_failed", "canceled")
        assert charged == []


@hostile_settings(EXAMPLES)
@given(data=st.data())
async def test_order_bodies_of_every_kind(target: Target, data: st.DataObject) -> None:
    """POST /orders with any body and content type: a documented answer; a refused order changes nothing;
    an accepted one is one whole order and nothing else; a repeat of a number answers its order."""
    body = data.draw(order_bodies(target), label="body")
    before = await target.before()
    content_type = data.draw(CONTENT_TYPES, label="content type")
    extra = [("Content-Type", content_type)] if content_type else []
    reply = await target.signed("POST", API + "/orders", "", body, extra=extra)
    assert_documented(reply)
    reached_the_endpoint(reply, body)
    answer = reply.body
    new = reply.status == 200 and answer["order_id"] not in {row["id"] for row in before["provider_orders"]}
    event(f"{reply.status} {answer.get('error_code') or ('new order' if new else 'repeat')}")
    after = await target.rows()
    if new:
        assert_whole_order(target, before, after, reply, body)
        target.accepted.add(answer["order_id"])
    elif reply.status == 200:
        assert answer["ok"] is True, reply.text[:300]  # a repeat answers the order it made
    assert target.settled_view(after) == target.settled_view(before)
    assert_balances_follow_ledgers(after)
    target.assert_quiet(reply)


# --- requests that are not signed right -------------------------------------------------------------------

BREAKAGES = (
    "drop_key", "drop_timestamp", "drop_signature", "unknown_key", "disabled_account", "garbage_stamp",
    "stale", "future", "other_secret", "other_path", "other_method", "other_body", "garbage_signature",
    "other_accounts_key",
)  # fmt: skip


@hostile_settings(EXAMPLES)
@given(data=st.data())
async def test_requests_not_signed_right_change_nothing(target: Target, data: st.DataObject) -> None:
    """Any endpoint, with a signature that is missing, stale, for another key, path, method, body or
    secret, or of a disabled account: 401 or 403 with an authentication code (413 first for a body over the
    limit from a known key); nothing changes."""
    method, template = data.draw(st.sampled_from([
        ("POST", "/ping"), ("GET", "/categories"), ("GET", "/products"), ("GET", "/products/{}"),
        ("POST", "/orders"), ("GET", "/orders/{}"), ("POST", "/orders/{}/cancel"),
    ]), label="endpoint")  # fmt: skip
    path = API + template.format(target.order_ids["held"])
    body = data.draw(order_bodies(target) if method == "POST" else bodies(), label="body")
    breakages = data.draw(st.lists(st.sampled_from(BREAKAGES), min_size=1, max_size=3, unique=True))
    headers = broken_headers(target, data, method, path, body, breakages)
    before = await target.before()
    reply = await target.send(method, path, body, headers)
    assert_documented(reply, {401: AUTH_CODES, 403: {"invalid_api_key"}, 413: {"request_too_large"}})
    assert reply.status in (401, 403, 413), reply.text[:300]
    await check_unchanged(target, before)
    target.assert_quiet(reply)


def broken_headers(
    target: Target, data: st.DataObject, method: str, path: str, body: bytes, breakages: Sequence[str]
) -> list[tuple[str, str]]:
    main = target.accounts["main"]
    key, secret, stamp = main.api_key, main.api_secret, int(time.time())
    signed_method, signed_path, signed_body = method, path, body
    for breakage in breakages:
        if breakage == "unknown_key":
            key = data.draw(st.sampled_from(["nobody", main.api_key + "x", main.api_key.upper()]))
        elif breakage == "disabled_account":
            key, secret = target.accounts["disabled"].api_key, target.accounts["disabled"].api_secret
        elif breakage == "other_accounts_key":
            key = target.accounts["other"].api_key
        elif breakage in ("stale", "future"):
            offset = data.draw(st.integers(61, 10**9))
            stamp = stamp - offset if breakage == "stale" else stamp + offset
        elif breakage == "other_secret":
            secret = data.draw(
                st.sampled_from([TOP_SECRET, secret + "x", target.accounts["other"].api_secret])
            )
        elif breakage == "other_path":
            signed_path = data.draw(st.sampled_from([path + "/", path.upper(), "/", API + "/elsewhere"]))
        elif breakage == "other_method":
            signed_method = "PUT"
        elif breakage == "other_body":
            signed_body = body + b" "
    names = HeaderNames.for_prefix(main.header_prefix)
    signature = sign(secret, signed_method, signed_path, stamp, signed_body)
    if "garbage_signature" in breakages:
        signature = data.draw(st.sampled_from(["", "0" * 64, "zz", signature[:-1]]))
    stamp_text = data.draw(st.sampled_from(["", "yesterday", "1e9", "-1", "١٧٠٠٠٠٠٠٠٠"])) if (
        "garbage_stamp" in breakages
    ) else str(stamp)  # fmt: skip
    headers = [(names.api_key, key), (names.timestamp, stamp_text), (names.signature, signature)]
    dropped = {
        "drop_key": names.api_key,
        "drop_timestamp": names.timestamp,
        "drop_signature": names.signature,
    }
    gone = {dropped[b] for b in breakages if b in dropped}
    return [(name, value) for name, value in headers if name not in gone]


# --- fixed cases: every poison in every order field, sizes, encodings, hang-ups ----------------------------

POISONS: dict[str, Any] = {
    "NUL": "a\x00b", "lone surrogate": "\ud800x", "control characters": "\x01\x1b[31m\x7f",
    "200k characters": "é" * 200_000, "empty": "", "nested 990 deep": nested(990, "obj"),
    "nested 5000 deep": nested(5000, "array"), "2**64": 2**64, "-2**63-1": -(2**63) - 1,
    "1e999999": Raw("1e999999"), "NaN": Raw("NaN"), "-0": Raw("-0"), "fraction": Decimal("1.5"),
    "object": {"\x00": "\ud800"}, "list": ["\x00"], "true": True, "null": None,
}  # fmt: skip
POISONED_FIELDS = ("sku_id", "quantity", "downstream_order_no", "trace_id", "callback_url",
                   "manual_form_data", "manual_form_data.account", "extra")  # fmt: skip


async def test_every_poison_in_every_order_field(target: Target) -> None:
    """Each poison (NUL, lone surrogate, huge and odd numbers, deep nesting, 200k characters ...) in each
    field of an otherwise valid order, escaped and raw: a documented answer, an order only when it is
    valid, nothing else changed, nothing leaked."""
    failures: list[str] = []
    number = 0
    for field_path in POISONED_FIELDS:
        for name, poison in POISONS.items():
            for ascii_only in (True, False) if isinstance(poison, str) and not poison.isascii() else (True,):
                number += 1
                fields: dict[str, Any] = {
                    "sku_id": target.skus["manual"], "quantity": 1, "downstream_order_no": f"POISON-{number}",
                    "trace_id": "poison", "manual_form_data": {"account": "player-1"},
                }  # fmt: skip
                *parents, last = ("poison" if field_path == "extra" else field_path).split(".")
                holder = fields
                for parent in parents:
                    holder = holder[parent]
                holder[last] = poison
                body = to_bytes(fields, ascii_only)
                before = await target.before()
                reply = await target.signed("POST", API + "/orders", body=body)
                case = f"{field_path} = {name} ({'escaped' if ascii_only else 'raw'})"
                try:
                    assert_documented(reply)
                    reached_the_endpoint(reply, body)
                    after = await target.rows()
                    if reply.status == 200 and reply.body["order_id"] not in {
                        row["id"] for row in before["provider_orders"]
                    }:
                        assert_whole_order(target, before, after, reply, body)
                        target.accepted.add(reply.body["order_id"])
                    assert target.settled_view(after) == target.settled_view(before)
                    assert_balances_follow_ledgers(after)
                    target.assert_quiet(reply)
                except AssertionError as error:
                    failures.append(f"{case}: {str(error).splitlines()[0][:200]}")
    assert not failures, "\n".join(failures)


ENDPOINTS = [("POST", "/ping"), ("GET", "/products"), ("POST", "/orders"), ("POST", "/orders/{held}/cancel")]


@pytest.mark.parametrize("size", [LIMIT, LIMIT + 1, 2 * LIMIT], ids=["limit", "limit+1", "twice"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("method", "template"), ENDPOINTS, ids=[f"{m} {p}" for m, p in ENDPOINTS])
async def test_bodies_around_the_limit(
    target: Target, method: str, template: str, size: int, chunked: bool
) -> None:
    """A signed body of exactly 1 MB reaches the endpoint; one byte more, sized or chunked, is 413
    ``request_too_large`` whatever the endpoint; nothing changes."""
    path = API + template.format(held=target.order_ids["held"])
    body = b'{"sku_id": 987654, "quantity": 1}'
    body += b" " * (size - len(body))
    headers = target.headers("main", method, path, body)
    before = await target.before()
    if chunked:

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 65_536):
                yield body[start : start + 65_536]

        async with target.session.request(
            method, target.base_url + path, data=chunks(), headers=CIMultiDict(headers)
        ) as response:
            text = await response.text()
            reply = Reply(response.status, text, response.content_type, CIMultiDict(response.headers),
                          json.loads(text))  # fmt: skip
    else:
        reply = await target.send(method, path, body, headers)
    assert_documented(reply)
    reached_the_endpoint(reply, body)
    if size <= LIMIT:
        assert reply.status != 413
    await check_unchanged(target, before)
    target.assert_quiet(reply)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", False), ("deflate", False), ("br", False), ("gzip", True), ("x-unknown", False)],
    ids=["gzip on plain bytes", "deflate on plain bytes", "brotli on plain bytes", "real gzip", "unknown"],
)
async def test_bodies_that_cannot_be_decoded(target: Target, encoding: str, compress: bool) -> None:
    """A signed order whose ``Content-Encoding`` does not match its bytes is 400 ``bad_request`` (a real gzip
    body is read decoded, so its signature over the compressed bytes does not verify); never a 5xx, no
    traceback, nothing changes."""
    plain = json.dumps({"sku_id": 987_654, "quantity": 1, "downstream_order_no": "ENC"}).encode()
    body = gzip.compress(plain) if compress else plain
    before = await target.before()
    reply = await target.signed("POST", API + "/orders", body=body, extra=[("Content-Encoding", encoding)])
    if reply.body.get("error_code") == "bad_content_encoding":
        # An encoding the HTTP parser cannot decode at all (brotli without its library) is refused before
        # any route: the public listener's own JSON error.
        assert (reply.status, reply.body["ok"], encoding) == (400, False, "br"), reply.text[:300]
    else:
        assert_documented(reply, {400: {"bad_request", "sku_unavailable"}, 401: {"invalid_signature"}})
    await check_unchanged(target, before)
    target.assert_quiet(reply)


async def test_a_client_hanging_up_mid_body(target: Target) -> None:
    """A correctly signed order whose sender closes the connection mid-body is a client's disconnect:
    logged below error level without a traceback, and nothing changes."""
    path = API + "/orders"
    body = json.dumps({"sku_id": target.skus["plain"], "quantity": 1}).encode() + b" " * 2000
    before = await target.before()
    parts = urlsplit(target.base_url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    headers = "".join(f"{name}: {value}\r\n" for name, value in target.headers("main", "POST", path, body))
    head = f"POST {path} HTTP/1.1\r\nHost: procurd\r\nContent-Length: {len(body)}\r\n{headers}\r\n"
    writer.write(head.encode() + body[:100])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    seen: list[dict[str, Any]] = []

    def disconnect_logged() -> bool:
        for line in target.new_log_lines():
            record = json.loads(line)
            assert "exception" not in record, line[:600]
            assert record.get("level") not in ("error", "critical"), line[:600]
            seen.append(record)
        return any("disconnect" in str(record.get("event")) for record in seen)

    await wait_until(disconnect_logged, timeout=10)
    await check_unchanged(target, before)


async def test_the_log_capture_sees_the_api(target: Target) -> None:
    """The captured log holds the provider's own lines (the checks above read something real), and the
    examples reached the endpoints (orders were accepted among them)."""
    reply = await target.signed("POST", API + "/ping", body=b"")
    assert reply.status == 200
    await target.daemon.operations.provider.refresh(["top"], full=True)
    events = [json.loads(line).get("event") for line in target.new_log_lines()]
    assert "provider.catalog_refreshed" in events
