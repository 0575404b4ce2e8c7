"""Hostile input against the public callback receiver: hypothesis over real sockets.

Random and adversarial bodies, headers, sizes, paths and methods go to procurd's public listener, which runs
in front of two sandbox upstreams with orders in every state. Whatever arrives, the receiver never answers
5xx; every answer is its JSON (``ok``, ``message``, ``error_code``); nothing changes (orders, procurements,
numbers, audit trail, outbox) unless the callback is validly signed by a configured upstream and names one of
that upstream's orders, and then only that order; no secret and no delivered payload reaches a log line or an
answer.

The examples are derandomized and bounded so the suite stays fast and repeatable.
``PROCURD_HOSTILE_EXAMPLES=5000 pytest tests/test_hostile_callbacks.py --hypothesis-show-statistics`` hunts
longer and prints how many cases each test tried.

The target (:func:`hostile_target`) and the checks it offers are shared with ``test_hostile_admin.py``.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import astuple, dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict
from sqlalchemy import Table, select
from yarl import URL

from procurd.config import Settings
from procurd.db.schema import audit_log, orders, outbox, procurement_numbers, procurements
from procurd.http.admin import make_admin_app
from procurd.http.errors import MAX_BODY_BYTES
from procurd.http.public import make_public_app
from procurd.http.testing import reserve_port, serve, submit_due, url_of
from procurd.logs import configure_logging
from procurd.operations import Operations
from procurd.operations.catalog_pass import run_sync
from procurd.operations.runtime import Runtime
from procurd.operations.views import ProcurementViews
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import HeaderNames, sign
from procurd.sandbox import Sandbox, SandboxConfig
from support import forget_cached_loggers, sql_rows, wait_until

HOSTILE_EXAMPLES = int(os.environ.get("PROCURD_HOSTILE_EXAMPLES", "120"))
# Shrinking a failure of these big requests can take minutes: on only when asked for.
HOSTILE_PHASES = (
    tuple(Phase)
    if os.environ.get("PROCURD_HOSTILE_SHRINK")
    else (Phase.explicit, Phase.generate, Phase.target)
)

MAIN_KEY = "hostile-main-key"
MAIN_SECRET = "hostile-main-secret-5f1c9e"
MAIN_PREFIX = "Service"
SECOND_KEY = "hostile-second-key"
SECOND_SECRET = "hostile-second-secret-a07d3b"
SECOND_PREFIX = "Partner"
ADMIN_TOKEN = "hostile-admin-token-c4e8d2"
WEBHOOK_SECRET = "hostile-webhook-secret-9b6a1f"
SECRETS = (MAIN_SECRET, SECOND_SECRET, ADMIN_TOKEN, WEBHOOK_SECRET)
# Every delivered payload (the sandbox's and the ones hostile callbacks carry) contains this mark.
PAYLOAD_MARK = "CARD-HOSTILE-7e3f"
OWN_CALLBACK_PATH = "/hooks/upstream"  # callback_url's own path: the receiver answers there too
STATE_TABLES: tuple[Table, ...] = (orders, procurements, procurement_numbers, audit_log, outbox)
UPSTREAM_STATUSES = ("delivered", "completed", "paid", "fulfilling", "partially_delivered", "pending_payment",
                     "canceled", "refunded", "partially_refunded")  # fmt: skip


def hostile_settings(max_examples: int = HOSTILE_EXAMPLES) -> settings:
    """The fixed profile of these tests: derandomized, bounded, no deadline, no example database."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=HOSTILE_PHASES,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,  # one target serves every example; each checks its own diff
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


# --- log capture ------------------------------------------------------------------------------------------


class LogCapture:
    """procurd's structured log at debug level, read line by line as the examples run."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self._offset = 0
        self.lines_seen = 0

    def start(self) -> None:
        configure_logging("debug", "json", self.stream)
        forget_cached_loggers()

    def stop(self) -> None:
        configure_logging("warning", "json")
        forget_cached_loggers()

    def new_lines(self) -> list[str]:
        text = self.stream.getvalue()
        fresh, self._offset = text[self._offset :], len(text)
        lines = [line for line in fresh.splitlines() if line.strip()]
        self.lines_seen += len(lines)
        return lines


def leaked(text: str) -> list[str]:
    """The secrets and delivered payloads that appear in ``text``."""
    return [value for value in (*SECRETS, PAYLOAD_MARK) if value in text]


# --- the target ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    content_type: str
    body: Any


Rows = dict[str, list[tuple[Any, ...]]]


@dataclass
class Target:
    """procurd's two listeners on a real database, in front of two sandbox upstreams."""

    sandboxes: dict[str, Sandbox]
    runtime: Runtime
    public_url: str
    admin_url: str
    session: aiohttp.ClientSession
    logs: LogCapture
    skus: dict[str, int] = field(default_factory=dict)  # an auto SKU of unlimited stock at 9.90
    manual_skus: dict[str, int] = field(default_factory=dict)
    replies: int = 0
    fresh: int = 0

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    async def send(
        self, method: str, url: str, body: bytes | None = None, headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        """One request, exactly as given: ``url`` is already percent-encoded, headers may repeat."""
        data: bytes | io.BytesIO | None = io.BytesIO(body) if body and len(body) > 64 * 1024 else body
        async with self.session.request(
            method, URL(url, encoded=True), data=data, headers=CIMultiDict(list(headers))
        ) as response:
            text = await response.text(errors="replace")
            self.replies += 1
            try:
                parsed: Any = json.loads(text, parse_float=Decimal)
            except ValueError:
                parsed = None
            return Reply(response.status, text, response.headers.get("Content-Type", ""), parsed)

    async def rows(self) -> Rows:
        """Every row of the tables a state change writes, in key order."""
        snapshot: Rows = {}
        for table in STATE_TABLES:
            statement = select(*snapshot_columns(table)).order_by(*table.primary_key.columns)
            snapshot[table.name] = [tuple(row) for row in await sql_rows(self.runtime.database, statement)]
        return snapshot

    def assert_quiet(self, reply: Reply | None = None, *, goods_in_fulfillments: bool = False) -> None:
        """No secret or delivered goods in the log lines written since the last check, nor in ``reply``
        (with ``goods_in_fulfillments``, goods may appear inside the fulfillment of a successful order
        view: that is where a storefront reads them); every log line is one JSON object."""
        for line in self.logs.new_lines():
            assert not leaked(line), f"log line leaks {leaked(line)}: {line[:300]}"
            assert isinstance(json.loads(line), dict), line[:300]
        if reply is None:
            return
        text = reply.text
        if goods_in_fulfillments and reply.status < 400 and isinstance(reply.body, dict):
            text = json.dumps(_without_fulfillments(reply.body), default=str)
        assert not leaked(text), f"answer leaks {leaked(text)}: {reply.text[:300]}"
        assert not [secret for secret in SECRETS if secret in reply.text], reply.text[:300]

    async def intake(self, order_no: str, upstream: str, **item: Any) -> None:
        """Accept an order through the admin API (the setup; hostile intake is test_hostile_admin's)."""
        body = {"order_no": order_no, "items": [{"upstream": upstream, "sku_id": self.skus[upstream],
                                                 "quantity": 1, **item}]}  # fmt: skip
        reply = await self.send(
            "POST", self.admin_url + "/api/v1/orders", json.dumps(body).encode(), admin_headers()
        )
        assert reply.status == 202, reply.text

    async def fresh_submitted(self) -> str:
        """A new order on ``main`` that the sandbox holds paid and undelivered; its number."""
        self.fresh += 1
        order_no = f"HC-F{self.fresh}"
        await self.submitted(order_no, "main")
        return order_no

    async def submitted(self, order_no: str, upstream: str) -> int:
        """Accept ``order_no`` and submit it; the sandbox keeps it paid, undelivered. Its upstream id."""
        self.sandboxes[upstream].faults.hold_delivery_next()
        await self.intake(order_no, upstream)
        assert await submit_due(self.runtime, upstream)
        view = await ProcurementViews(self.runtime).order(order_no)
        assert view is not None
        procurement = view["procurements"][0]
        assert procurement["state"] == "submitted", procurement
        return int(procurement["upstream_order_id"])


def _without_fulfillments(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_fulfillments(item) for key, item in value.items() if key != "fulfillment"}
    if isinstance(value, list):
        return [_without_fulfillments(item) for item in value]
    return value


def admin_headers(token: str = ADMIN_TOKEN) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")]


def target_settings(
    database_url: str, callback_url: str, sandboxes: Mapping[str, Sandbox], **server: Any
) -> Settings:
    credentials = {"main": (MAIN_KEY, MAIN_SECRET, MAIN_PREFIX), "second": (SECOND_KEY, SECOND_SECRET,
                                                                            SECOND_PREFIX)}  # fmt: skip
    return Settings(
        database={"url": database_url},
        server={
            "callback_url": callback_url,
            "allow_private_callback_url": True,
            "admin_token": ADMIN_TOKEN,
            **server,
        },
        upstreams=[
            {
                "name": name,
                "base_url": sandbox.base_url,
                "api_key": credentials[name][0],
                "api_secret": credentials[name][1],
                "header_prefix": credentials[name][2],
                "timeout_seconds": 5,
                "max_requests_per_second": 1000,
            }
            for name, sandbox in sandboxes.items()
        ],
        procurement={"max_attempts": 2, "retry_base_seconds": 0.01, "retry_max_seconds": 0.05},
        storefront={
            "webhook_url": "http://127.0.0.1:9/storefront/events",
            "webhook_api_key": "shop",
            "webhook_secret": WEBHOOK_SECRET,
        },
    )


def sandbox_config(api_key: str, api_secret: str, header_prefix: str) -> SandboxConfig:
    return SandboxConfig(
        api_key=api_key,
        api_secret=api_secret,
        header_prefix=header_prefix,
        products=4,
        skus_per_product=2,
        balance=Decimal("1000000.00"),
        allow_private_callbacks=True,
        callback_retry_delays=(),
    )


@asynccontextmanager
async def hostile_target(database_url: str, **server: Any) -> AsyncIterator[Target]:
    """Both listeners with both upstreams mirrored, the log captured, and orders in every state:

    ``HC-D1`` delivered (payload with :data:`PAYLOAD_MARK`), ``HC-S1`` submitted, ``HC-X1`` an exception
    (price above its limit), all on ``main``; ``HC-S2`` submitted and ``HC-Q1`` queued on ``second``.
    ``server`` overrides ``[server]`` keys (short time limits: the test client then opens a connection per
    request, so that none it reuses was closed for idleness meanwhile).
    """
    logs = LogCapture()
    logs.start()
    public_sock = reserve_port()
    try:
        async with (
            Sandbox(sandbox_config(MAIN_KEY, MAIN_SECRET, MAIN_PREFIX)) as main,
            Sandbox(sandbox_config(SECOND_KEY, SECOND_SECRET, SECOND_PREFIX)) as second,
        ):
            sandboxes = {"main": main, "second": second}
            callback_url = url_of(public_sock) + OWN_CALLBACK_PATH
            operations = Operations(
                Runtime.build(
                    target_settings(database_url, callback_url, sandboxes, **server), instance="hostile"
                )
            )
            runtime = operations.runtime
            try:
                await runtime.start()
                async with (
                    serve(make_public_app(operations), public_sock) as public_url,
                    serve(make_admin_app(operations)) as admin_url,
                    aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(force_close=bool(server))
                    ) as session,
                ):
                    target = Target(sandboxes, runtime, public_url, admin_url, session, logs)
                    await _prepare(target)
                    yield target
            finally:
                await operations.close()
    finally:
        public_sock.close()
        logs.stop()


async def _prepare(target: Target) -> None:
    for name, sandbox in target.sandboxes.items():
        state = sandbox.state
        target.skus[name] = state.product(state.add_product(price="9.90")).skus[0].id
        target.manual_skus[name] = state.product(state.add_product(fulfillment_type="manual")).skus[0].id
        report = await run_sync(target.runtime.database, target.runtime.client(name), name, holder="hostile")
        assert report.status == "ok", report.error
    delivered_id = await target.submitted("HC-D1", "main")
    main = target.sandboxes["main"]
    await main.deliver(delivered_id, f"{PAYLOAD_MARK}-sandbox-delivery")
    await main.wait_callbacks_idle()
    view = await ProcurementViews(target.runtime).order("HC-D1")
    assert view is not None
    assert view["status"] == "delivered", view
    await target.submitted("HC-S1", "main")
    await target.submitted("HC-S2", "second")
    await target.intake("HC-X1", "main", max_unit_price="0.01")
    await target.intake("HC-Q1", "second")  # on second: main's worker takes the oldest due procurement
    target.assert_quiet()


# --- what a matching callback is ---------------------------------------------------------------------------


def numbers_known(rows: Rows) -> dict[tuple[str, str], tuple[int | None, str]]:
    """``(upstream, downstream_order_no)`` to the upstream order id procurd knows and the order number: the
    procurement's own for its current number, the one kept with a number it no longer uses otherwise."""
    current = {row.id: row for row in named_rows(rows, procurements)}
    known = {}
    for row in named_rows(rows, procurement_numbers):
        owner = current[row.procurement_id]
        order_id = (
            owner.upstream_order_id
            if owner.downstream_order_no == row.downstream_order_no
            else row.upstream_order_id
        )
        known[(row.upstream, row.downstream_order_no)] = (order_id, owner.order_no)
    return known


def snapshot_columns(table: Table) -> list[Any]:
    """Every column, but an event's payload: the order view it copies is large, written once, never changed
    (a new event is a new row)."""
    return [column for column in table.columns if (table.name, column.name) != ("outbox", "payload")]


def named_rows(rows: Rows, table: Table) -> list[Any]:
    names = [column.name for column in snapshot_columns(table)]
    return [SimpleNamespace(**dict(zip(names, values, strict=True))) for values in rows[table.name]]


def matching_order(upstream: str, body: bytes, rows: Rows) -> str | None:
    """The order a callback from ``upstream`` with ``body`` may change: its number is one of that upstream's
    and its ``order_id`` does not contradict the one procurd knows. ``None`` when it matches nothing."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    number, order_id = data.get("downstream_order_no"), data.get("order_id")
    if not isinstance(number, str) or isinstance(order_id, bool) or not isinstance(order_id, int):
        return None
    known = numbers_known(rows).get((upstream, number))
    if known is None or known[0] not in (None, order_id):
        return None
    return known[1]


def without_order(rows: Rows, order_no: str) -> Rows:
    """``rows`` less every row that belongs to ``order_no``."""
    ids = {row.id for row in named_rows(rows, procurements) if row.order_no == order_no}
    kept: Rows = {}
    for table in STATE_TABLES:
        named = named_rows(rows, table)
        keep = [
            not (getattr(row, "order_no", None) == order_no or getattr(row, "procurement_id", None) in ids)
            if table is not procurements
            else row.order_no != order_no
            for row in named
        ]
        kept[table.name] = [values for values, wanted in zip(rows[table.name], keep, strict=True) if wanted]
    return kept


# --- JSON that hypothesis builds --------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text emitted as it is (deep nesting, NaN, numbers Python would not print)."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object as key/value pairs: keys may repeat."""

    pairs: tuple[tuple[str, Any], ...]


def encode(value: Any, ascii_only: bool = True) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        inner = ",".join(f"{encode(key, ascii_only)}:{encode(item, ascii_only)}" for key, item in value.pairs)
        return "{" + inner + "}"
    if isinstance(value, dict):
        return encode(Obj(tuple(value.items())), ascii_only)
    if isinstance(value, list | tuple):
        return "[" + ",".join(encode(item, ascii_only) for item in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=ascii_only)


def to_bytes(value: Any, ascii_only: bool = True) -> bytes:
    """The JSON text as UTF-8; lone surrogates written raw (invalid UTF-8) when not escaped."""
    return encode(value, ascii_only).encode("utf-8", "surrogatepass")


ODD_STRINGS = (
    "", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "\u202eevil", "🙂", "null", "true", "0", "-1", "1e999",
    "NaN", "../../etc/passwd", "<script>alert(1)</script>", "' OR 1=1 --", "%s%n", "${jndi:ldap://x}",
    "HC-S1", "HC-D1", "HC-S2", "\ufeffHC-S1", "HC-S1\n", " HC-S1", "hc-s1", "x" * 97, "é" * 33, "\t",
)  # fmt: skip
LONG_STRINGS = st.builds(
    lambda unit, count: unit * count, st.sampled_from(["x", "é", "🙂", "\x00"]), st.integers(100, 200_000)
)
HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(ODD_STRINGS),
    st.text(st.characters(codec=None, categories=["Cs", "Cc", "Cf", "Zs", "So"]), min_size=1, max_size=8),
    LONG_STRINGS,
)
HOSTILE_NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([Raw("1e999999"), Raw("-0"), Raw("1E400"), Raw("0.1e-999999"), Raw("9" * 5000),
                     Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1.0"), Raw("01")]),
)  # fmt: skip
HOSTILE_SCALARS = st.one_of(st.none(), st.booleans(), HOSTILE_NUMBERS, HOSTILE_TEXT)


def nested(depth: int, kind: str) -> Raw:
    if kind == "array":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    pairs = st.lists(st.tuples(HOSTILE_TEXT, children), max_size=4)
    return st.one_of(st.lists(children, max_size=4), pairs.map(lambda items: Obj(tuple(items))))


# Any JSON value, adversarial at every level, deeply nested, with repeated keys.
HOSTILE_JSON = st.one_of(
    st.builds(nested, st.sampled_from([40, 200, 990, 5000, 100_000]), st.sampled_from(["array", "obj"])),
    st.recursive(HOSTILE_SCALARS, _containers, max_leaves=10),
)
PAYLOAD_TEXT = (st.text(max_size=20) | st.sampled_from(ODD_STRINGS)).map(
    lambda tail: f"{PAYLOAD_MARK}-{tail}"
)
GOOD_FULFILLMENT = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "manual"]), "status": st.just("delivered"), "payload": PAYLOAD_TEXT,
     "delivery_data": st.none() | st.fixed_dictionaries({"code": PAYLOAD_TEXT}),
     "delivered_at": st.just("2026-01-01T00:00:00Z")},
)  # fmt: skip
MUTATIONS = st.sampled_from(["keep", "keep", "keep", "replace", "drop", "repeat"])


def mutate(draw: st.DrawFn, fields: Mapping[str, Any]) -> Obj:
    """``fields`` with some values replaced by hostile ones, some dropped, some keys repeated."""
    pairs: list[tuple[str, Any]] = []
    for key, value in fields.items():
        action = draw(MUTATIONS)
        if action == "keep":
            pairs.append((key, value))
        elif action == "replace":
            pairs.append((key, draw(HOSTILE_JSON)))
        elif action == "repeat":
            pairs += [(key, value), (key, draw(HOSTILE_JSON))]
    extra = draw(st.lists(st.tuples(HOSTILE_TEXT, HOSTILE_SCALARS), max_size=2))
    return Obj(tuple(pairs + extra))


@st.composite
def mutated_fulfillments(draw: st.DrawFn) -> Obj:
    return mutate(draw, draw(GOOD_FULFILLMENT))


FULFILLMENTS = st.one_of(st.none(), GOOD_FULFILLMENT, mutated_fulfillments(), HOSTILE_JSON)
EVENTS = st.sampled_from(["order.fulfilled", "order.status_changed"]) | HOSTILE_TEXT
STATUSES = st.sampled_from(UPSTREAM_STATUSES) | HOSTILE_TEXT
SHAPES = st.sampled_from(["report", "report", "report", "mutated", "other_json", "garbage"])


@st.composite
def callback_bodies(draw: st.DrawFn, rows: Rows) -> bytes:
    """A callback body: a well-formed report about a known (or unknown) order, mutated or not, or garbage."""
    known = sorted(numbers_known(rows).items())
    (_, number), (order_id, _) = draw(st.sampled_from(known))
    order_id = order_id or 1
    fields: dict[str, Any] = {
        "event": draw(EVENTS),
        "order_id": draw(st.sampled_from([order_id, order_id, order_id + 1]) | HOSTILE_NUMBERS),
        "order_no": draw(st.just(f"DJ{order_id}") | HOSTILE_TEXT),
        "downstream_order_no": draw(st.sampled_from([number, number, "HC-NOPE"]) | HOSTILE_TEXT),
        "status": draw(STATUSES),
        "fulfillment": draw(FULFILLMENTS),
        "timestamp": draw(st.just(int(time.time())) | HOSTILE_NUMBERS),
    }
    shape = draw(SHAPES)
    ascii_only = draw(st.booleans())
    if shape == "report":
        return to_bytes(fields, ascii_only)
    if shape == "mutated":
        return to_bytes(mutate(draw, fields), ascii_only)
    if shape == "other_json":
        return to_bytes(draw(HOSTILE_JSON), ascii_only)
    valid = to_bytes(fields)
    return draw(
        st.sampled_from([b"", b"\xef\xbb\xbf" + valid, valid[: len(valid) // 2], valid + b"x", b"\xff\xfe",
                         valid.replace(b'"delivered"', b"NaN")])
        | st.binary(max_size=64)
    )  # fmt: skip


# --- signing ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    upstream: str
    api_key: str
    secret: str
    prefix: str

    def headers(
        self, body: bytes, path: str = CALLBACK_PATH, stamp: int | None = None
    ) -> list[tuple[str, str]]:
        names = HeaderNames.for_prefix(self.prefix)
        stamp = int(time.time()) if stamp is None else stamp
        signature = sign(self.secret, "POST", path, stamp, body)
        return [(names.api_key, self.api_key), (names.timestamp, str(stamp)), (names.signature, signature)]


MAIN = Credentials("main", MAIN_KEY, MAIN_SECRET, MAIN_PREFIX)
SECOND = Credentials("second", SECOND_KEY, SECOND_SECRET, SECOND_PREFIX)

AUTH_CODES = {"missing_auth_headers", "invalid_timestamp", "timestamp_expired", "invalid_signature",
              "invalid_api_key"}  # fmt: skip
HEADER_TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"], exclude_characters="\r\n"), max_size=40
)
# What can be wrong with the signature headers. Those that change what is signed re-sign the request, so
# each is the only thing wrong unless several are drawn.
BREAKAGES = (
    "drop_key", "drop_timestamp", "drop_signature", "blank_signature", "foreign_prefix", "unknown_key",
    "other_upstreams_key", "garbage_timestamp", "stale_timestamp", "future_timestamp", "garbage_signature",
    "signed_other_body", "signed_other_path", "signed_other_method", "signed_other_secret",
    "signed_other_timestamp", "duplicate_garbage_first",
)  # fmt: skip
UNKNOWN_KEYS = st.sampled_from(["nobody", "", f"{MAIN_KEY}x", MAIN_KEY.upper()]) | HEADER_TEXT
GARBAGE_STAMPS = st.sampled_from(["", "yesterday", "--5", "1e9", "1.5", "²", "١٧٠٠٠٠٠٠٠٠", "0x10", "+17",
                                  "17000000000000", "-"]) | HEADER_TEXT  # fmt: skip
GARBAGE_SIGNATURES = st.sampled_from(["0" * 64, "", "zz", "f" * 63, "F" * 64]) | HEADER_TEXT
OTHER_PATHS = st.sampled_from(["/", "/api/v1/upstream/callback/", "/api/v1/upstream/callbacks",
                               "/API/V1/UPSTREAM/CALLBACK", "/api/v1/upstream/orders"])  # fmt: skip
FOREIGN_PREFIXES = st.sampled_from(["Other", "X-Service", "Servic"])


@dataclass
class Signing:
    """What goes into the headers, and what the signature is computed over."""

    who: Credentials
    body: bytes
    stamp: str = field(default_factory=lambda: str(int(time.time())))
    key: str = ""
    path: str = CALLBACK_PATH
    method: str = "POST"
    secret: str = ""
    signed_stamp: str = ""
    signature: str | None = None

    def __post_init__(self) -> None:
        self.key, self.secret, self.signed_stamp = self.who.api_key, self.who.secret, self.stamp

    @property
    def other(self) -> Credentials:
        return SECOND if self.who is MAIN else MAIN


def _break_signing(draw: st.DrawFn, signing: Signing, breakage: str) -> None:
    now = int(time.time())
    if breakage == "unknown_key":
        signing.key = draw(UNKNOWN_KEYS)
    elif breakage == "other_upstreams_key":
        signing.key = signing.other.api_key
    elif breakage == "garbage_timestamp":
        signing.stamp = draw(GARBAGE_STAMPS)
    elif breakage in ("stale_timestamp", "future_timestamp"):
        offset = draw(st.integers(61, 10**9))
        signing.stamp = signing.signed_stamp = str(
            now - offset if breakage == "stale_timestamp" else now + offset
        )
    elif breakage == "signed_other_body":
        signing.body = signing.body + draw(st.binary(min_size=1, max_size=8))
    elif breakage == "signed_other_path":
        signing.path = draw(OTHER_PATHS)
    elif breakage == "signed_other_method":
        signing.method = draw(st.sampled_from(["GET", "PUT", "DELETE"]))
    elif breakage == "signed_other_secret":
        signing.secret = draw(st.sampled_from([signing.other.secret, "", signing.who.secret + "x"]))
    elif breakage == "signed_other_timestamp":
        signing.signed_stamp = str(now - 1)
    elif breakage == "garbage_signature":
        signing.signature = draw(GARBAGE_SIGNATURES)


def _break_headers(
    draw: st.DrawFn, signing: Signing, headers: list[tuple[str, str]], breakages: list[str]
) -> list[tuple[str, str]]:
    names = HeaderNames.for_prefix(signing.who.prefix)
    dropped = {
        "drop_key": names.api_key,
        "drop_timestamp": names.timestamp,
        "drop_signature": names.signature,
    }
    headers = [(name, value) for name, value in headers if name not in {dropped.get(b) for b in breakages}]
    if "blank_signature" in breakages:
        headers = [(name, " " if name == names.signature else value) for name, value in headers]
    if "foreign_prefix" in breakages:
        prefix = draw(FOREIGN_PREFIXES | st.just(signing.other.prefix))
        renamed = dict(zip(astuple(names), astuple(HeaderNames.for_prefix(prefix)), strict=True))
        headers = [(renamed[name], value) for name, value in headers]
    if "duplicate_garbage_first" in breakages:
        name = draw(st.sampled_from(astuple(names)))
        headers.insert(0, (name, draw(HEADER_TEXT)))
    return headers


@st.composite
def broken_headers(draw: st.DrawFn, body: bytes) -> tuple[list[tuple[str, str]], list[str]]:
    """The signature headers of ``body`` with at least one thing wrong, and the breakages applied."""
    signing = Signing(draw(st.sampled_from([MAIN, SECOND])), body)
    breakages = draw(st.lists(st.sampled_from(BREAKAGES), min_size=1, max_size=3, unique=True))
    for breakage in breakages:
        _break_signing(draw, signing, breakage)
    signature = signing.signature
    if signature is None:
        signature = sign(signing.secret, signing.method, signing.path, signing.signed_stamp, signing.body)
    names = HeaderNames.for_prefix(signing.who.prefix)
    headers = [(names.api_key, signing.key), (names.timestamp, signing.stamp), (names.signature, signature)]
    return _break_headers(draw, signing, headers, breakages), breakages


# --- the properties -----------------------------------------------------------------------------------------


def assert_receiver_answer(reply: Reply, accepted_statuses: Sequence[int]) -> None:
    """A JSON answer of the receiver: ``{"ok": true, "message": "received"}``, or
    ``{"ok": false, "error_code", "message"}``; never a 5xx."""
    assert reply.status < 500, reply.text[:300]
    assert reply.content_type.startswith("application/json"), (reply.status, reply.content_type)
    assert isinstance(reply.body, dict), reply.text[:300]
    if reply.status == 200:
        assert reply.body == {"ok": True, "message": "received"}
    else:
        assert reply.body["ok"] is False
        assert isinstance(reply.body.get("error_code"), str)
        assert reply.body["error_code"]
        assert isinstance(reply.body.get("message"), str)
        assert reply.body["message"]
    assert reply.status in accepted_statuses, (reply.status, reply.text[:300])


@pytest.fixture
async def target(database_url: str) -> AsyncIterator[Target]:
    """procurd in front of two sandboxes, orders in every state, the log captured at debug level."""
    async with hostile_target(database_url) as target:
        yield target


@hostile_settings()
@given(data=st.data())
async def test_unsigned_or_missigned_callbacks_change_nothing(target: Target, data: st.DataObject) -> None:
    """A callback with a broken signature header is refused 401/403 and changes nothing, whatever its body."""
    before = await target.rows()
    body = data.draw(callback_bodies(before), label="body")
    headers, breakages = data.draw(broken_headers(body), label="headers")
    path = data.draw(st.sampled_from([CALLBACK_PATH, OWN_CALLBACK_PATH]), label="path")
    reply = await target.send("POST", target.public_url + path, body, headers)
    if len(body) > MAX_BODY_BYTES:
        assert_receiver_answer(reply, (413,))
    else:
        assert_receiver_answer(reply, (401, 403))
        assert reply.body["error_code"] in AUTH_CODES, breakages
    assert await target.rows() == before
    target.assert_quiet(reply)


@hostile_settings()
@given(data=st.data())
async def test_signed_callbacks_change_only_the_order_they_match(target: Target, data: st.DataObject) -> None:
    """A signed callback is accepted only for its upstream's order, changes only it (one naming an upstream
    order procurd has not recorded only once the upstream confirms it: otherwise refused, and noted in that
    order's audit trail); a replay changes none."""
    before = await target.rows()
    who = data.draw(st.sampled_from([MAIN, SECOND]), label="upstream")
    body = data.draw(callback_bodies(before), label="body")
    sign_path = data.draw(st.sampled_from([CALLBACK_PATH, OWN_CALLBACK_PATH]), label="signed path")
    post_path = data.draw(st.sampled_from([CALLBACK_PATH, OWN_CALLBACK_PATH]), label="post path")
    headers = who.headers(body, sign_path)
    reply = await target.send("POST", target.public_url + post_path, body, headers)
    assert_receiver_answer(reply, (413,) if len(body) > MAX_BODY_BYTES else (200, 400, 404))
    order_no = matching_order(who.upstream, body, before)
    after = await target.rows()
    if reply.status != 200 and reply.body["error_code"] == "callback_unverified":
        # A claim the upstream did not confirm: only its order's audit trail notes it.
        assert order_no is not None, "an unverified callback that matches no order"
        assert_only_unverified_noted(before, after, order_no)
    elif reply.status != 200:
        assert after == before
    else:
        assert order_no is not None, "a callback that matches no order was accepted"
        assert without_order(after, order_no) == without_order(before, order_no)
        replay = await target.send("POST", target.public_url + post_path, body, headers)
        assert_receiver_answer(replay, (200,))
        assert_replay_changed_no_state(after, await target.rows())
    target.assert_quiet(reply)


def assert_only_unverified_noted(before: Rows, after: Rows, order_no: str) -> None:
    """Nothing changed but ``order_no``'s audit trail, which gained a ``callback_unverified`` entry or one
    more repeat on its last one."""
    assert without_order(after, order_no) == without_order(before, order_no)
    for table in (orders, procurements, procurement_numbers, outbox):
        assert after[table.name] == before[table.name], table.name
    old = [row for row in named_rows(before, audit_log) if row.order_no == order_no]
    new = [row for row in named_rows(after, audit_log) if row.order_no == order_no]
    if len(new) == len(old) + 1:
        assert new[:-1] == old
        assert (new[-1].event, new[-1].count) == ("callback_unverified", 1)
    else:
        assert len(new) == len(old)
        assert new[:-1] == old[:-1]
        assert (new[-1].event, new[-1].count) == ("callback_unverified", old[-1].count + 1)


def assert_replay_changed_no_state(first: Rows, replayed: Rows) -> None:
    """The same accepted callback again changes no order, procurement, number or event; at most the audit
    trail notes a late status again."""
    for table in (orders, procurements, procurement_numbers, outbox):
        assert replayed[table.name] == first[table.name], table.name
    added = named_rows(replayed, audit_log)[len(first["audit_log"]) :]
    assert [row.event for row in added] in ([], ["late_status_ignored"]), [row.event for row in added]


# Values that broke (or could break) a JSON reader, a database driver or a response writer: every one goes
# into every field of a validly signed report, so CI always tries each pair whatever hypothesis draws.
POISONS: dict[str, Any] = {
    "NUL": "HC\x00S1",
    "lone surrogate": "\ud800x",
    "control characters": "\x01\x1b[31m\x7f",
    "right-to-left override": "\u202eHC-S1",
    "97 characters": "x" * 97,
    "200k characters": "é" * 200_000,
    "empty": "",
    "nested 990 deep": nested(990, "obj"),
    "nested 5000 deep": nested(5000, "array"),
    "2**64": 2**64,
    "-1": -1,
    "fraction": Decimal("1.5"),
    "1e999999": Raw("1e999999"),
    "NaN": Raw("NaN"),
    "object": {"\x00": "\ud800"},
    "list": ["\x00"],
    "true": True,
}
POISONED_FIELDS = (
    "downstream_order_no", "status", "order_no", "event", "order_id", "timestamp", "fulfillment",
    "fulfillment.type", "fulfillment.payload", "fulfillment.delivery_data", "fulfillment.delivery_data.code",
    "fulfillment.delivered_at", "extra",
)  # fmt: skip


def poisoned_report(order_id: int, number: str, field_path: str, poison: Any) -> dict[str, Any]:
    """A delivery report of ``number`` with ``poison`` at ``field_path`` (dotted; a new key for extra)."""
    fulfillment = {
        "type": "auto",
        "status": "delivered",
        "payload": f"{PAYLOAD_MARK}-poisoned",
        "delivery_data": {"code": f"{PAYLOAD_MARK}-code"},
        "delivered_at": "2026-01-01T00:00:00Z",
    }
    report: dict[str, Any] = {
        "event": "order.fulfilled", "order_id": order_id, "order_no": f"DJ{order_id}",
        "downstream_order_no": number, "status": "delivered", "timestamp": int(time.time()),
        "fulfillment": fulfillment,
    }  # fmt: skip
    *parents, last = ("poison" if field_path == "extra" else field_path).split(".")
    holder = report
    for name in parents:
        holder = holder[name]
    holder[last] = poison
    return report


async def test_signed_callbacks_with_poisoned_fields(target: Target) -> None:
    """Each poison in each field of a signed report: no 5xx, a change only when accepted, nothing leaked."""
    failures: list[str] = []
    live = await target.fresh_submitted()
    rows = await target.rows()
    for field_path in POISONED_FIELDS:
        for name, poison in POISONS.items():
            for ascii_only in (True, False) if isinstance(poison, str) and not poison.isascii() else (True,):
                order_id, _ = numbers_known(rows)[("main", live)]
                body = to_bytes(poisoned_report(order_id or 1, live, field_path, poison), ascii_only)
                reply = await target.send("POST", target.public_url + CALLBACK_PATH, body, MAIN.headers(body))
                case = f"{field_path} = {name} ({'escaped' if ascii_only else 'raw'})"
                try:
                    assert_receiver_answer(reply, (413,) if len(body) > MAX_BODY_BYTES else (200, 400, 404))
                    if reply.status != 200:
                        before, rows = rows, await target.rows()
                        assert rows == before, "refused, yet something changed"
                    target.assert_quiet(reply)
                except AssertionError as error:
                    failures.append(f"{case}: {str(error).splitlines()[0][:200]}")
                if reply.status == 200:
                    live = await target.fresh_submitted()  # the next poison meets a live order again
                    rows = await target.rows()
    assert not failures, "\n".join(failures)


SIZES = (MAX_BODY_BYTES - 1, MAX_BODY_BYTES, MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 65_536)


@pytest.mark.parametrize("size", SIZES, ids=["cap-1", "cap", "cap+1", "cap+64k"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_bodies_around_the_size_cap(target: Target, size: int, chunked: bool) -> None:
    """A signed report padded to the cap is accepted, beyond it refused 413 (sized or chunked); no change."""
    before = await target.rows()
    view = await ProcurementViews(target.runtime).order("HC-D1")
    assert view is not None
    report = {"order_id": view["procurements"][0]["upstream_order_id"], "downstream_order_no": "HC-D1",
              "status": "delivered"}  # fmt: skip
    body = json.dumps(report).encode()
    body += b" " * (size - len(body))
    headers = MAIN.headers(body)
    if chunked:

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 65_536):
                yield body[start : start + 65_536]

        async with target.session.post(
            target.public_url + CALLBACK_PATH, data=chunks(), headers=CIMultiDict(headers)
        ) as response:
            reply = Reply(
                response.status, await response.text(), response.content_type, await response.json()
            )
    else:
        reply = await target.send("POST", target.public_url + CALLBACK_PATH, body, headers)
    if size <= MAX_BODY_BYTES:
        assert_receiver_answer(reply, (200,))
    else:
        assert_receiver_answer(reply, (413,))
        assert reply.body["error_code"] == "payload_too_large"
    assert await target.rows() == before
    target.assert_quiet(reply)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_compressed_bodies_inflating_past_the_cap(target: Target, encoding: str) -> None:
    """A 2 KB compressed body inflating past the cap is refused 413 by both listeners; nothing changes."""
    raw = b'{"a": "' + b"0" * (2 * MAX_BODY_BYTES) + b'"}'
    data = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    before = await target.rows()
    compressed = [("Content-Encoding", encoding)]
    callback = await target.send(
        "POST", target.public_url + CALLBACK_PATH, data, [*MAIN.headers(data), *compressed]
    )
    intake = await target.send(
        "POST", target.admin_url + "/api/v1/orders", data, [*admin_headers(), *compressed]
    )
    assert_receiver_answer(callback, (413,))
    assert (intake.status, intake.body["error_code"]) == (413, "payload_too_large")
    assert await target.rows() == before
    target.assert_quiet(callback)
    target.assert_quiet(intake)


# Methods HTTP parsers know (aiohttp's parser refuses unknown ones itself: see EDGE_REQUESTS).
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "PROPFIND", "PURGE")
# aiohttp's HTTP parser refuses a longer request line itself, before any application code runs.
REQUEST_LINE_LIMIT = 8190


def hostile_paths(known: Sequence[str]) -> st.SearchStrategy[str]:
    """Percent-encoded paths: the real ones, near misses, traversal, odd bytes, long ones."""
    segments = HOSTILE_TEXT.map(lambda text: quote(text.encode("utf-8", "surrogatepass"), safe=""))
    return st.one_of(
        st.sampled_from(known),
        st.builds(lambda base, tail: base + tail, st.sampled_from(known),
                  st.sampled_from(["/", "//", "/..", "?x=1", "%00", "/%2e%2e/", "#frag", ";a=b", "%ZZ"])),
        st.lists(segments, min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts)),
        st.sampled_from(["/" + "a" * 8000, "/" + "a" * 10_000]),
    )  # fmt: skip


def request_line_too_long(method: str, path: str) -> bool:
    return len(f"{method} {path} HTTP/1.1") > REQUEST_LINE_LIMIT


def assert_json_answer(reply: Reply, method: str, path: str) -> None:
    """Below 500, and JSON with a boolean ``ok`` (HEAD has no body), an over-long request line refused by
    the HTTP parser included."""
    assert reply.status < 500, (method, path[:200], reply.status, reply.text[:200])
    if request_line_too_long(method, path):
        assert reply.status >= 400, (method, path[:200], reply.status)
    if method != "HEAD":
        assert reply.content_type.startswith("application/json"), (method, path[:200], reply.text[:200])
        assert isinstance(reply.body, dict), reply.text[:200]
        assert isinstance(reply.body.get("ok"), bool), reply.text[:200]


@hostile_settings()
@given(data=st.data())
async def test_any_method_and_path_on_the_public_listener(target: Target, data: st.DataObject) -> None:
    """Any method on any path of the public listener answers JSON below 500 and changes nothing."""
    before = await target.rows()
    method = data.draw(st.sampled_from(METHODS), label="method")
    path = data.draw(hostile_paths([CALLBACK_PATH, OWN_CALLBACK_PATH, "/healthz", "/"]), label="path")
    body = data.draw(st.none() | st.binary(max_size=64), label="body")
    # aiohttp's client cannot read the parser's refusal of an over-long HEAD: it comes with a body.
    assume(method != "HEAD" or not request_line_too_long(method, path))
    reply = await target.send(method, target.public_url + path, body)
    assert_json_answer(reply, method, path)
    assert await target.rows() == before
    target.assert_quiet(reply)


async def test_the_log_capture_sees_rejections(target: Target) -> None:
    """The captured log holds procurd's own lines (the checks above read something real)."""
    reply = await target.send("POST", target.public_url + CALLBACK_PATH, b"{}", MAIN.headers(b"{}")[:2])
    assert reply.status == 401
    lines = [json.loads(line) for line in target.logs.new_lines()]
    assert any(line.get("event") == "callback.rejected" for line in lines)
    delivered = await ProcurementViews(target.runtime).order("HC-D1")
    assert delivered is not None
    assert PAYLOAD_MARK in delivered["procurements"][0]["fulfillment"]["payload"]


# --- the edges of both listeners: encodings, the HTTP parser, disconnects, slow clients --------------------


@dataclass(frozen=True)
class RawAnswer:
    status: int
    status_line: str
    headers: CIMultiDict[str]
    text: str
    body: Any


async def read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    """One HTTP answer: the status line, the headers and a Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
    text = (await reader.readexactly(int(headers.get("Content-Length", "0")))).decode()
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = None
    return RawAnswer(int(status_line.split()[1]), status_line, headers, text, body)


async def raw_exchange(url: str, request: bytes, timeout: float = 10) -> RawAnswer:
    """``request`` sent byte for byte on a new connection, and the answer read from it."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(read_answer(reader), timeout)
    finally:
        writer.close()


def raw_request(path: str, body: bytes, *headers: str, method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: procurd", "Connection: close", *headers]
    if not any(header.lower().startswith("transfer-encoding") for header in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


PLAIN = b'{"order_no": "HE-1", "items": []}'
NUL_AFTER_TOKEN = f"Authorization: Bearer {ADMIN_TOKEN}\x00"
CHUNKS = b"zz\r\nab\r\n0\r\n\r\n"  # a chunk size that is not hexadecimal
# Requests that no handler may read: an undecodable Content-Encoding, and what aiohttp's HTTP parser refuses.
# Each is built from the path and the listener's extra headers (the admin listener's token).
EDGE_REQUESTS: dict[str, tuple[Callable[[str, Sequence[str]], bytes], str]] = {
    "gzip on plain bytes": (
        lambda path, extra: raw_request(path, PLAIN, *extra, "Content-Encoding: gzip"),
        "bad_content_encoding",
    ),
    "gzip labelled deflate": (
        lambda path, extra: raw_request(path, gzip.compress(PLAIN), *extra, "Content-Encoding: deflate"),
        "bad_content_encoding",
    ),
    "brotli": (
        lambda path, extra: raw_request(path, PLAIN, *extra, "Content-Encoding: br"),
        "bad_content_encoding",
    ),
    "bad chunk size": (
        lambda path, extra: raw_request(path, CHUNKS, *extra, "Transfer-Encoding: chunked"),
        "bad_request",
    ),
    "NUL in a header": (
        lambda path, extra: raw_request(path, PLAIN, *extra, "X-Note: a\x00b"),
        "bad_request",
    ),
    "NUL after the token": (lambda path, extra: raw_request(path, PLAIN, NUL_AFTER_TOKEN), "bad_request"),
    "header line too long": (
        lambda path, extra: raw_request(path, PLAIN, *extra, "X-Note: " + "a" * 9000),
        "bad_request",
    ),
    "not a method": (lambda path, extra: raw_request(path, PLAIN, *extra, method="G\x01T"), "bad_request"),
}


def server_errors_counted(target: Target) -> list[tuple[str, str, str]]:
    """(listener, route, status) of every 5xx answer counted so far."""
    counted = []
    for metric in target.runtime.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "procurd_http_requests_total" and sample.labels["status"].startswith("5"):
                counted.append((sample.labels["listener"], sample.labels["route"], sample.labels["status"]))
    return counted


def assert_no_error_logged(lines: Sequence[str]) -> None:
    """No log line at error level, and no traceback, among ``lines`` (the client's mistake is not ours)."""
    for line in lines:
        record = json.loads(line)
        assert record.get("level") not in ("error", "critical"), line[:400]
        assert "exception" not in record, line[:400]


async def check_edge_request(
    target: Target, base_url: str, path: str, case: str, extra_headers: Sequence[str] = ()
) -> RawAnswer:
    """The edge case answered 400 with the listener's JSON error, nothing changed, nothing logged as an
    error, no 5xx counted."""
    build, code = EDGE_REQUESTS[case]
    before = await target.rows()
    answer = await raw_exchange(base_url, build(path, extra_headers))
    assert answer.status == 400, (case, answer.status_line, answer.text)
    assert answer.headers["Content-Type"].startswith("application/json"), (case, answer.text)
    assert (answer.body["ok"], answer.body["error_code"]) == (False, code), (case, answer.text)
    assert not leaked(answer.text)
    assert await target.rows() == before
    lines = target.logs.new_lines()
    assert_no_error_logged(lines)
    assert not [line for line in lines if leaked(line)]
    assert server_errors_counted(target) == []
    return answer


@pytest.mark.parametrize("case", list(EDGE_REQUESTS))
async def test_undecodable_and_unparsable_requests_on_the_public_listener(target: Target, case: str) -> None:
    """Each request that cannot be decoded or parsed is answered 400 with the receiver's JSON error
    (``ok``, ``error_code``, ``message``), changes nothing, and is logged as one line below error level.
    The requests carry a configured upstream's signature headers: the receiver reads a body only once
    they passed (an unsigned one is answered 401 unread, see test_http_public)."""
    answer = await check_edge_request(target, target.public_url, CALLBACK_PATH, case, signed_headers_of(MAIN))
    assert isinstance(answer.body["message"], str)
    assert answer.body["message"]


def signed_headers_of(credentials: Credentials) -> list[str]:
    """Signature header lines of ``credentials`` (over an empty body: the receiver reads the body of a
    request only once these passed, and the body's own signature is checked after it arrived)."""
    return [f"{name}: {value}" for name, value in credentials.headers(b"")]


async def hang_up_mid_body(base_url: str, path: str, headers: Sequence[str] = ()) -> None:
    """Send a request's headers and the first bytes of a longer body, then close the connection."""
    parts = urlsplit(base_url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    lines = [f"POST {path} HTTP/1.1", "Host: procurd", "Content-Length: 1000", *headers]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + b'{"order_no": ')
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def check_hang_up(target: Target, base_url: str, path: str, headers: Sequence[str] = ()) -> None:
    """A client hanging up mid-body is logged as a disconnect at info level, counted as 499, not as a
    server or database failure, and changes nothing."""
    before = await target.rows()
    await hang_up_mid_body(base_url, path, headers)
    seen: list[dict[str, Any]] = []

    def disconnect_logged() -> bool:
        seen.extend(json.loads(line) for line in target.logs.new_lines())
        return any(record.get("event") == "http.client_disconnected" for record in seen)

    await wait_until(disconnect_logged, timeout=10)
    assert_no_error_logged([json.dumps(record) for record in seen])
    assert not [record for record in seen if record.get("event") == "http.database_unavailable"]
    assert server_errors_counted(target) == []
    assert await target.rows() == before


async def test_a_client_hanging_up_mid_body_on_the_public_listener(target: Target) -> None:
    """A callback whose sender disconnects mid-body is a client disconnect, not a database failure (its
    signature headers let the receiver read the body)."""
    await check_hang_up(target, target.public_url, CALLBACK_PATH, signed_headers_of(MAIN))


@pytest.fixture
async def impatient_target(database_url: str) -> AsyncIterator[Target]:
    """The target with one-second header and body time limits."""
    async with hostile_target(database_url, header_timeout_seconds=1, body_timeout_seconds=1) as target:
        yield target


SLOW_CONNECTIONS = 100


async def check_slow_headers_are_cut(base_url: str, path: str) -> None:
    """``SLOW_CONNECTIONS`` connections that send part of their headers and then nothing are all closed by
    the server once the header time limit (1 s) has passed."""
    parts = urlsplit(base_url)
    started = time.monotonic()
    connections = [await asyncio.open_connection(parts.hostname, parts.port) for _ in range(SLOW_CONNECTIONS)]
    try:
        for _, writer in connections:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: procurd\r\nX-Slow: ".encode())
            await writer.drain()
        leftovers = await asyncio.wait_for(
            asyncio.gather(*(reader.read() for reader, _ in connections)), timeout=10
        )
    finally:
        for _, writer in connections:
            writer.close()
    assert leftovers == [b""] * SLOW_CONNECTIONS
    assert time.monotonic() - started >= 0.9


async def check_slow_body_is_refused(base_url: str, path: str, headers: Sequence[str] = ()) -> RawAnswer:
    """A body that stops arriving is answered 408 with the listener's JSON error once the body time limit
    (1 s) has passed, and the connection is to be closed."""
    parts = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        lines = [f"POST {path} HTTP/1.1", "Host: procurd", "Content-Length: 1000", *headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + b'{"order_no": ')
        await writer.drain()
        answer = await asyncio.wait_for(read_answer(reader), timeout=10)
    finally:
        writer.close()
    assert answer.status == 408, answer.text
    assert (answer.body["ok"], answer.body["error_code"]) == (False, "request_timeout")
    assert answer.headers.get("Connection", "").lower() == "close"
    return answer


async def test_slow_clients_on_the_public_listener(impatient_target: Target) -> None:
    """Slow headers are cut after the header time limit, a slow body is refused 408; nothing changes and
    nothing is logged as an error."""
    target = impatient_target
    before = await target.rows()
    await check_slow_headers_are_cut(target.public_url, CALLBACK_PATH)
    answer = await check_slow_body_is_refused(target.public_url, CALLBACK_PATH, signed_headers_of(MAIN))
    assert answer.body["message"] == "the body did not arrive within 1 s"
    assert await target.rows() == before
    assert_no_error_logged(target.logs.new_lines())
