"""Hostile input against the admin API: hypothesis over real sockets.

Random and adversarial intake bodies, tokens, paths, queries and methods go to procurd's admin listener (a
token is configured). Whatever arrives: never a 5xx; every answer is JSON with the documented shape
(``{"ok": true, ...}`` or ``{"ok": false, "error_code", "error_message"}``; ``/metrics`` is Prometheus text);
a request without the valid token changes nothing; a refused request changes nothing; an accepted intake is
one whole order (its order row, one procurement, number and audit entry per item) and nothing else; no
secret reaches a log line or an answer, and delivered goods appear only in the order views' fulfillment.

The target, the checks and the strategies are those of ``test_hostile_callbacks.py``; the same profile
applies (``PROCURD_HOSTILE_EXAMPLES`` for a longer hunt, ``--hypothesis-show-statistics`` for the counts).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any
from urllib.parse import quote, unquote, urlencode

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from multidict import CIMultiDict

from procurd.core.numbers import ORDER_NO_PATTERN, item_number
from procurd.db.schema import audit_log, orders, procurement_numbers, procurements
from procurd.http.console import is_console_path
from procurd.http.errors import MAX_BODY_BYTES
from test_hostile_callbacks import (
    ADMIN_TOKEN,
    EDGE_REQUESTS,
    HOSTILE_JSON,
    HOSTILE_SCALARS,
    HOSTILE_TEXT,
    MAIN_SECRET,
    METHODS,
    POISONS,
    Obj,
    Raw,
    Reply,
    Rows,
    Target,
    admin_headers,
    assert_json_answer,
    assert_no_error_logged,
    check_edge_request,
    check_hang_up,
    check_slow_body_is_refused,
    check_slow_headers_are_cut,
    hostile_settings,
    hostile_target,
    mutate,
    named_rows,
    request_line_too_long,
    to_bytes,
    without_order,
)

ORDERS_PATH = "/api/v1/orders"


@pytest.fixture
async def target(database_url: str) -> AsyncIterator[Target]:
    """procurd in front of two sandboxes, orders in every state, the log captured at debug level."""
    async with hostile_target(database_url) as target:
        yield target


@pytest.fixture
async def proxied_target(database_url: str) -> AsyncIterator[Target]:
    """The target behind a trusted proxy on loopback: X-Forwarded-For names each request's client."""
    async with hostile_target(database_url, trusted_proxies=["127.0.0.1"]) as target:
        yield target


# Each example of wrong tokens comes from an address of its own (wrong tokens are throttled per address).
GUESSERS = itertools.count(1)


# --- what an answer and an accepted order must look like ---------------------------------------------------


def assert_admin_answer(reply: Reply, method: str, path: str) -> None:
    """Below 500; JSON ``{"ok": true, ...}`` or ``{"ok": false, "error_code", "error_message"}``."""
    assert_json_answer(reply, method, path)
    if method == "HEAD" or not isinstance(reply.body, dict):
        return
    if reply.status < 400:
        assert reply.body["ok"] is True, reply.text[:300]
        return
    assert reply.body["ok"] is False, reply.text[:300]
    assert isinstance(reply.body.get("error_code"), str), reply.text[:300]
    assert reply.body["error_code"], reply.text[:300]
    assert isinstance(reply.body.get("error_message"), str), reply.text[:300]
    assert reply.body["error_message"], reply.text[:300]


def assert_whole_order(before: Rows, after: Rows, order_no: str, body: bytes) -> None:
    """``order_no`` is new with one procurement, number and intake audit entry per item, and nothing else
    changed."""
    items = json.loads(body)["items"]
    assert without_order(after, order_no) == without_order(before, order_no)
    assert [row.order_no for row in named_rows(before, orders) if row.order_no == order_no] == []
    assert [row.status for row in named_rows(after, orders) if row.order_no == order_no] in (
        ["paid"],
        ["fulfilling"],
    )
    bought = [row for row in named_rows(after, procurements) if row.order_no == order_no]
    assert [row.downstream_order_no for row in bought] == [
        item_number(order_no, n) for n in range(len(items))
    ]
    assert all(row.state == "queued" or row.exception_reason == "price_above_limit" for row in bought)
    ids = {row.id for row in bought}
    numbers = [row for row in named_rows(after, procurement_numbers) if row.procurement_id in ids]
    assert sorted(row.downstream_order_no for row in numbers) == sorted(
        row.downstream_order_no for row in bought
    )
    entries = [row for row in named_rows(after, audit_log) if row.order_no == order_no]
    assert sorted((row.procurement_id, row.source) for row in entries) == sorted((i, "intake") for i in ids)


# --- intake bodies ----------------------------------------------------------------------------------------

ORDER_NOS = st.one_of(
    # Existing orders, numbers derived from them, and a pair whose numbers collide (HM-1's second item
    # is HM-1-2, HM-1-2's first).
    st.sampled_from(
        ["HC-D1", "HC-S1", "HC-Q1", "hc-new", "A" * 64, "A" * 65, "HC-D1-2", "HC-S1-r2", "HM-1", "HM-1-2"]
    ),
    st.from_regex(ORDER_NO_PATTERN, fullmatch=True),
    HOSTILE_TEXT,
)
QUANTITIES = st.sampled_from(
    [1, 1, 2, 0, -1, 100_000, 100_001, 2**63, 2**64, "1", Decimal("1.5"), True, None]
)
PRICES = st.one_of(
    st.sampled_from(["9.90", "9.9", "10", "0.01", "0", "-1", "", " 9.90 ", "1e999999", "1E-999999", "NaN",
                     "Infinity", "x" * 41, "9" * 40, "9.90.1", "٩.٩٠"]),
    st.sampled_from([Raw("9.90"), Raw("1e999999"), Raw("-0.0"), 10, True, None]),
    HOSTILE_TEXT,
)  # fmt: skip
FORMS = st.one_of(
    st.just({"account": "buyer@example.com"}),
    st.just({}),
    st.just({"n": Raw("1e999999")}),
    st.just({"n": Raw("1e400")}),
    HOSTILE_JSON,
)


UPSTREAM_NAMES = st.sampled_from(["nope", "", None]) | HOSTILE_TEXT
ODD_IDS = st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, "1", Decimal("1.0"), True])


@st.composite
def intake_items(draw: st.DrawFn, target: Target) -> Obj:
    upstream = draw(st.sampled_from(["main", "second"]))
    skus = [target.skus[upstream], target.manual_skus[upstream], target.skus["main"], 999_999]
    fields: dict[str, Any] = {
        "upstream": draw(st.just(upstream) | UPSTREAM_NAMES),
        "sku_id": draw(st.sampled_from(skus) | ODD_IDS),
        "quantity": draw(QUANTITIES),
    }
    if draw(st.booleans()):
        fields["manual_form_data"] = draw(FORMS)
    if draw(st.booleans()):
        fields["max_unit_price"] = draw(PRICES)
    if draw(st.integers(0, 4)) == 0:
        return mutate(draw, fields)
    return Obj(tuple(fields.items()))


def many_items(target: Target) -> st.SearchStrategy[list[Obj]]:
    """The most items an order may have (100), and one more."""
    item = Obj((("upstream", "main"), ("sku_id", target.skus["main"]), ("quantity", 1)))
    return st.sampled_from([100, 101]).map(lambda count: [item] * count)


@st.composite
def intake_bodies(draw: st.DrawFn, target: Target) -> bytes:
    """An intake body: a plausible order (sometimes valid) with hostile values, mutated, or garbage."""
    fields: dict[str, Any] = {
        "order_no": draw(ORDER_NOS),
        "items": draw(st.lists(intake_items(target), min_size=0, max_size=3) | many_items(target)),
    }
    if draw(st.booleans()):
        fields["trace_id"] = draw(st.sampled_from(["trace-1", "t" * 128, "t" * 129]) | HOSTILE_TEXT)
    shape = draw(st.sampled_from(["order", "order", "order", "order", "mutated", "other_json", "garbage"]))
    ascii_only = draw(st.booleans())
    if shape == "order":
        return to_bytes(fields, ascii_only)
    if shape == "mutated":
        return to_bytes(mutate(draw, fields), ascii_only)
    if shape == "other_json":
        return to_bytes(draw(HOSTILE_JSON), ascii_only)
    return draw(st.sampled_from([b"", b"null", b"\xef\xbb\xbf{}", b"{", b"\xff"]) | st.binary(max_size=64))


async def post_order(target: Target, body: bytes) -> Reply:
    return await target.send("POST", target.admin_url + ORDERS_PATH, body, admin_headers())


async def check_intake(target: Target, body: bytes) -> Reply:
    """POST ``body``; the answer is well formed and the database holds a whole new order or no change."""
    before = await target.rows()
    reply = await post_order(target, body)
    assert_admin_answer(reply, "POST", ORDERS_PATH)
    after = await target.rows()
    if reply.status == 202:
        assert_whole_order(before, after, reply.body["order"]["order_no"], body)
    else:
        assert reply.status in (200, 400, 409, 413, 422), reply.text[:300]
        assert after == before
    target.assert_quiet(reply, goods_in_fulfillments=True)
    return reply


@hostile_settings()
@given(data=st.data())
async def test_intake_stores_a_whole_order_or_nothing(target: Target, data: st.DataObject) -> None:
    """Any intake body yields one whole new order (202), a repeat (200) or a clean 4xx that stores nothing."""
    await check_intake(target, data.draw(intake_bodies(target), label="body"))


INTAKE_FIELDS = (
    "order_no", "trace_id", "items", "items.0", "items.0.upstream", "items.0.sku_id", "items.0.quantity",
    "items.0.manual_form_data", "items.0.manual_form_data.account", "items.0.max_unit_price", "extra",
    "items.0.extra",
)  # fmt: skip


def poisoned_order(target: Target, number: int, field_path: str, poison: Any) -> dict[str, Any]:
    item = {"upstream": "main", "sku_id": target.manual_skus["main"], "quantity": 1,
            "manual_form_data": {"account": "buyer@example.com"}, "max_unit_price": "100.00"}  # fmt: skip
    order: dict[str, Any] = {"order_no": f"HP-{number}", "trace_id": "hostile", "items": [item]}
    *parents, last = field_path.replace("extra", "poison").split(".")
    holder: Any = order
    for name in parents:
        holder = holder[int(name)] if name.isdigit() else holder[name]
    if isinstance(holder, list):
        holder[int(last)] = poison
    else:
        holder[last] = poison
    return order


async def test_intake_with_poisoned_fields(target: Target) -> None:
    """Each poison in each field of an otherwise valid order: never a 5xx, a whole order or nothing."""
    failures: list[str] = []
    number = 0
    for field_path in INTAKE_FIELDS:
        for name, poison in POISONS.items():
            for ascii_only in (True, False) if isinstance(poison, str) and not poison.isascii() else (True,):
                number += 1
                body = to_bytes(poisoned_order(target, number, field_path, poison), ascii_only)
                try:
                    await check_intake(target, body)
                except AssertionError as error:
                    mode = "escaped" if ascii_only else "raw"
                    failures.append(f"{field_path} = {name} ({mode}): {str(error).splitlines()[0][:200]}")
    assert not failures, "\n".join(failures)


SIZES = (MAX_BODY_BYTES - 1, MAX_BODY_BYTES, MAX_BODY_BYTES + 1)


@pytest.mark.parametrize("size", SIZES, ids=["cap-1", "cap", "cap+1"])
async def test_intake_bodies_around_the_size_cap(target: Target, size: int) -> None:
    """A valid order padded to ``size`` bytes is accepted up to the cap and refused 413 above, unchanged."""
    order = {"order_no": f"HS-{size}", "items": [{"upstream": "main", "sku_id": target.skus["main"],
                                                   "quantity": 1}]}  # fmt: skip
    body = json.dumps(order).encode()
    body += b" " * (size - len(body))
    reply = await check_intake(target, body)
    assert reply.status == (202 if size <= MAX_BODY_BYTES else 413)


# --- the token --------------------------------------------------------------------------------------------

ADMIN_PATHS = (
    "/api/v1/orders", "/api/v1/orders/HC-S1", "/api/v1/orders/HC-Q1/cancel", "/api/v1/orders/HC-D1/audit",
    "/api/v1/exceptions", "/api/v1/exceptions/1/retry", "/api/v1/exceptions/4/resolve", "/api/v1/status",
    "/metrics", "/healthz", "/",
)  # fmt: skip


def header_safe(value: str) -> bool:
    """What an HTTP client can send as a header value at all: valid UTF-8, no control characters, and short
    enough for aiohttp's parser (a longer line is refused 400 before procurd sees it)."""
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return len(encoded) < 4000 and not any(ord(char) < 32 or ord(char) == 127 for char in value)


BAD_AUTHORIZATIONS = st.one_of(
    st.sampled_from([
        None, "", "Bearer", "Bearer ", f"Token {ADMIN_TOKEN}", f"Basic {ADMIN_TOKEN}",
        f"Bearer {ADMIN_TOKEN}x", f"Bearer {ADMIN_TOKEN[:-1]}", f"Bearer {ADMIN_TOKEN.upper()}",
        f"Bearer{ADMIN_TOKEN}", f"{ADMIN_TOKEN}", f"Bearer {MAIN_SECRET}", "Bearer \u00e9",
        f"Bearer {ADMIN_TOKEN} {ADMIN_TOKEN}",
    ]),
    HOSTILE_TEXT.map(lambda text: f"Bearer {text}").filter(lambda value: header_safe(value)),
)  # fmt: skip


@hostile_settings()
@given(data=st.data())
async def test_requests_without_the_token_change_nothing(proxied_target: Target, data: st.DataObject) -> None:
    """Without the valid bearer token every path but /healthz answers 401 and nothing changes."""
    target = proxied_target
    before = await target.rows()
    method = data.draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"]), label="method")
    path = data.draw(st.sampled_from(ADMIN_PATHS), label="path")
    authorization = data.draw(BAD_AUTHORIZATIONS, label="authorization")
    guesser = next(GUESSERS)
    headers = [
        ("Content-Type", "application/json"),
        ("X-Forwarded-For", f"10.{guesser // 250}.{guesser % 250}.1"),
    ]
    if authorization is not None:
        headers.append(("Authorization", authorization))
    body = json.dumps({"order_no": "HT-1", "items": [{"upstream": "main", "sku_id": target.skus["main"],
                                                      "quantity": 1}], "note": "n"}).encode()  # fmt: skip
    reply = await target.send(method, target.admin_url + path, body, headers)
    assert_admin_answer(reply, method, path)
    if path == "/healthz":
        assert reply.status in (200, 405)
    else:
        assert (reply.status, reply.body["error_code"]) == (401, "unauthorized"), reply.text[:200]
    assert await target.rows() == before
    target.assert_quiet(reply)


# --- any request with the token ---------------------------------------------------------------------------

SEGMENTS = st.one_of(
    st.sampled_from(["HC-D1", "HC-S1", "HC-Q1", "HC-X1", "HC-S2", "NOPE", "1", "2", "3", "4", "5", "0", "-1",
                     str(2**63), str(2**64), "1.0", "%00", "%ED%A0%80", "a%00b", "..", "%2F", "x" * 300]),
    HOSTILE_TEXT.map(lambda text: quote(text.encode("utf-8", "surrogatepass"), safe="")),
)  # fmt: skip
TEMPLATES = (
    "/api/v1/orders/{}", "/api/v1/orders/{}/cancel", "/api/v1/orders/{}/audit", "/api/v1/exceptions/{}/retry",
    "/api/v1/exceptions/{}/resolve", "/api/v1/{}", "/{}", "/api/v1/orders/{}/{}", "/api/v1/exceptions/{}",
)  # fmt: skip
QUERY_VALUES = st.sampled_from(["1", "0", "-1", "100", "101", "1000001", str(2**64), "", "main",
                                "price_above_limit", "x" * 65, "١", "1.5"]) | HOSTILE_TEXT  # fmt: skip
QUERY_NAMES = st.sampled_from(["upstream", "reason", "page", "page_size", "other"])


@st.composite
def admin_paths(draw: st.DrawFn) -> str:
    template = draw(st.sampled_from(TEMPLATES) | st.sampled_from(ADMIN_PATHS))
    path = template.format(*(draw(SEGMENTS) for _ in range(template.count("{}"))))
    # The web console answers HTML (test_console.py): the JSON shape checked here is the API's.
    assume(not is_console_path(unquote(path)))
    query = draw(st.lists(st.tuples(QUERY_NAMES, QUERY_VALUES), max_size=3))
    if query:
        encoded = [(name, value.encode("utf-8", "surrogatepass")) for name, value in query]
        path += "?" + urlencode(encoded)
    return path


ACTION_BODIES = st.one_of(
    st.sampled_from([b"", b"{}", b'{"note": "checked by hand"}', b'{"note": ""}', b'{"note": 5}', b"[]",
                     b'{"note": "' + b"n" * 4001 + b'"}', b"null", b"{"]),
    st.builds(lambda note: to_bytes({"note": note}), HOSTILE_SCALARS),
    st.builds(to_bytes, HOSTILE_JSON),
)  # fmt: skip


def changed_order(before: Rows, path: str, status: int) -> str | None:
    """The order a successful cancel, retry or resolve at ``path`` may change."""
    parts = path.split("?")[0].split("/")
    if status >= 300 or len(parts) != 6:
        return None
    if parts[3] == "orders" and parts[5] == "cancel":
        return parts[4]
    if parts[3] == "exceptions" and parts[5] in ("retry", "resolve") and parts[4].isdigit():
        owners = {row.id: row.order_no for row in named_rows(before, procurements)}
        return owners.get(int(parts[4]))
    return None


@hostile_settings()
@given(data=st.data())
async def test_any_request_with_the_token(target: Target, data: st.DataObject) -> None:
    """With the token any request answers below 500; refusals and reads change nothing, actions one order."""
    before = await target.rows()
    method = data.draw(st.sampled_from(METHODS), label="method")
    path = data.draw(admin_paths(), label="path")
    body = data.draw(ACTION_BODIES, label="body") if method in ("POST", "PUT", "PATCH") else None
    assume(method != "HEAD" or not request_line_too_long(method, path))
    headers = CIMultiDict(admin_headers())
    reply = await target.send(method, target.admin_url + path, body, list(headers.items()))
    if path.split("?")[0] == "/metrics" and method == "GET":
        assert reply.status == 200
        assert reply.content_type.startswith("text/plain")
    else:
        assert_admin_answer(reply, method, path)
    after = await target.rows()
    order_no = changed_order(before, path, reply.status) if method == "POST" else None
    if order_no is None:
        assert after == before
    else:
        assert without_order(after, order_no) == without_order(before, order_no)
    target.assert_quiet(reply, goods_in_fulfillments=True)


# --- the edges: encodings, the HTTP parser, disconnects, slow clients --------------------------------------

BEARER = f"Authorization: Bearer {ADMIN_TOKEN}"


@pytest.mark.parametrize("case", list(EDGE_REQUESTS))
async def test_undecodable_and_unparsable_intake(target: Target, case: str) -> None:
    """Each intake that cannot be decoded or parsed is answered 400 with the admin JSON error
    (``error_code``, ``error_message``), stores nothing, and is logged as one line below error level."""
    answer = await check_edge_request(target, target.admin_url, ORDERS_PATH, case, [BEARER])
    assert isinstance(answer.body["error_message"], str)
    assert answer.body["error_message"]


async def test_a_client_hanging_up_mid_intake(target: Target) -> None:
    """A storefront that disconnects mid-body is a client disconnect (info, 499), not a database failure
    (which would be logged at error level and answered 503)."""
    await check_hang_up(target, target.admin_url, ORDERS_PATH, [BEARER])


@pytest.fixture
async def impatient_target(database_url: str) -> AsyncIterator[Target]:
    """The target with one-second header and body time limits."""
    async with hostile_target(database_url, header_timeout_seconds=1, body_timeout_seconds=1) as target:
        yield target


async def test_slow_clients_on_the_admin_listener(impatient_target: Target) -> None:
    """Slow headers are cut after the header time limit, a slow intake body is refused 408; nothing changes
    and nothing is logged as an error."""
    target = impatient_target
    before = await target.rows()
    await check_slow_headers_are_cut(target.admin_url, ORDERS_PATH)
    answer = await check_slow_body_is_refused(target.admin_url, ORDERS_PATH, [BEARER])
    assert answer.body["error_message"] == "the body did not arrive within 1 s"
    assert await target.rows() == before
    assert_no_error_logged(target.logs.new_lines())
