"""The public listener: the signed callback receiver against real sockets, the sandbox and the database."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import text

from procurd.http.errors import MAX_BODY_BYTES
from procurd.http.testing import Stack, procurd_stack, reserve_port, serve, url_of
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import HeaderNames, sign
from procurd.sandbox.callbacks import callback_body
from procurd.sandbox.testing import ApiResponse, SignedClient
from support import captured_log, sql_execute


@pytest.fixture
async def stack(database_url: str) -> AsyncIterator[Stack]:
    """procurd in front of the sandbox, with both upstreams' catalogues mirrored."""
    async with procurd_stack(database_url) as stack:
        await stack.sync("main")
        await stack.sync("second")
        yield stack


async def submitted(stack: Stack, order_no: str = "C1", upstream: str = "main") -> dict[str, Any]:
    """An order whose one procurement the sandbox holds as paid (delivery held back); its procurement view."""
    stack.sandbox.faults.hold_delivery_next()
    sku = stack.sandbox.state.first_sku("auto")
    answer = await stack.admin(
        "POST",
        "/api/v1/orders",
        {"order_no": order_no, "items": [{"upstream": upstream, "sku_id": sku.id, "quantity": 1}]},
    )
    assert answer.status == 202, answer.body
    assert await stack.submit_due(upstream)
    procurement: dict[str, Any] = (await stack.order(order_no))["procurements"][0]
    assert procurement["state"] == "submitted"
    return procurement


def delivered_body(stack: Stack, order_id: int) -> bytes:
    """The callback body the sandbox sends once it delivered ``order_id`` (delivered there, not sent)."""
    order = stack.sandbox.state.deliver(order_id)
    return callback_body(order, int(time.time()))


async def post(signer: SignedClient, body: bytes, **overrides: Any) -> ApiResponse:
    headers = {"Content-Type": "application/json", **overrides.pop("headers", {})}
    return await signer.request("POST", CALLBACK_PATH, body=body, headers=headers, **overrides)


async def test_signed_delivery_callback_is_applied_and_answered_received(stack: Stack) -> None:
    """A valid callback delivers the procurement and is answered ``received`` once stored."""
    procurement = await submitted(stack)
    async with stack.signer() as signer:
        answer = await post(signer, delivered_body(stack, procurement["upstream_order_id"]))
    assert answer.status == 200
    assert answer.json() == {"ok": True, "message": "received"}
    order = await stack.order("C1")
    item = order["procurements"][0]
    assert order["status"] == "delivered"
    assert item["state"] == "delivered"
    fulfillment = stack.sandbox.state.order(procurement["upstream_order_id"]).fulfillment
    assert fulfillment is not None
    assert item["fulfillment"]["payload"] == fulfillment.payload
    status = (await stack.admin("GET", "/api/v1/status")).body
    assert status["upstreams"][0]["callbacks"] == {"accepted": 1, "rejected": 0}


async def test_sandbox_pushes_its_own_callback_end_to_end(stack: Stack) -> None:
    """The sandbox's own signed push to the configured callback_url delivers the order."""
    sku = stack.sandbox.state.first_sku("auto")
    await stack.admin(
        "POST",
        "/api/v1/orders",
        {"order_no": "E2E", "items": [{"upstream": "main", "sku_id": sku.id, "quantity": 1}]},
    )
    assert await stack.submit_due()
    await stack.sandbox.wait_callbacks_idle()
    assert [attempt.ok for attempt in stack.sandbox.callback_log] == [True]
    assert (await stack.order("E2E"))["status"] == "delivered"


async def test_duplicate_callback_is_answered_ok_and_changes_nothing(stack: Stack) -> None:
    """The same callback twice is answered ``received`` both times and applied once."""
    procurement = await submitted(stack)
    body = delivered_body(stack, procurement["upstream_order_id"])
    async with stack.signer() as signer:
        first = await post(signer, body)
        after_first = await stack.order("C1")
        audit_first = await stack.operations.views.audit("C1")
        second = await post(signer, body)
    assert (first.status, second.status) == (200, 200)
    assert second.json() == {"ok": True, "message": "received"}
    assert await stack.order("C1") == after_first
    assert await stack.operations.views.audit("C1") == audit_first


async def test_late_paid_after_delivered_is_recorded_not_applied(stack: Stack) -> None:
    """An out-of-order ``paid`` after ``delivered`` is answered ok, audited, and the state stays delivered."""
    procurement = await submitted(stack)
    order_id = procurement["upstream_order_id"]
    late = json.dumps({"event": "order.status_changed", "order_id": order_id, "downstream_order_no": "C1",
                       "status": "paid", "timestamp": int(time.time())}).encode()  # fmt: skip
    async with stack.signer() as signer:
        assert (await post(signer, delivered_body(stack, order_id))).status == 200
        answer = await post(signer, late)
    assert answer.json() == {"ok": True, "message": "received"}
    item = (await stack.order("C1"))["procurements"][0]
    assert (item["state"], item["upstream_status"]) == ("delivered", "delivered")
    events = [entry["event"] for entry in await stack.operations.views.audit("C1")]
    assert events[-1] == "late_status_ignored"


def _body(procurement: dict[str, Any], **changes: Any) -> bytes:
    data: dict[str, Any] = {
        "event": "order.fulfilled",
        "order_id": procurement["upstream_order_id"],
        "order_no": procurement["upstream_order_no"],
        "downstream_order_no": procurement["downstream_order_no"],
        "status": "delivered",
        "fulfillment": {"type": "auto", "status": "delivered", "payload": "CARD-1", "delivery_data": None,
                        "delivered_at": "2026-01-01T00:00:00Z"},
        "timestamp": int(time.time()),
    }  # fmt: skip
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data).encode()


_DROP = object()
Case = Callable[[dict[str, Any]], tuple[bytes, dict[str, Any]]]

BAD_CALLBACKS: dict[str, tuple[Case, int, str]] = {
    "bad signature": (lambda p: (_body(p), {"signature": "0" * 64}), 401, "invalid_signature"),
    "wrong secret": (lambda p: (_body(p), {"api_secret": "not-the-secret"}), 401, "invalid_signature"),
    "signed over another path": (lambda p: (_body(p), {"sign_path": "/elsewhere"}), 401, "invalid_signature"),
    "body changed after signing": (
        lambda p: (
            _body(p),
            {"signature": sign("sandbox-secret", "POST", CALLBACK_PATH, int(time.time()), b"{}")},
        ),
        401,
        "invalid_signature",
    ),
    "stale timestamp": (
        lambda p: (_body(p), {"timestamp": int(time.time()) - 120}),
        401,
        "timestamp_expired",
    ),
    "future timestamp": (
        lambda p: (_body(p), {"timestamp": int(time.time()) + 120}),
        401,
        "timestamp_expired",
    ),
    "unreadable timestamp": (lambda p: (_body(p), {"timestamp": "yesterday"}), 401, "invalid_timestamp"),
    "no signature header": (
        lambda p: (_body(p), {"omit_headers": ["Service-Signature"]}),
        401,
        "missing_auth_headers",
    ),
    "another header prefix": (
        lambda p: (
            _body(p),
            {"omit_headers": ["Service-Api-Key"], "headers": {"Other-Api-Key": "sandbox-key"}},
        ),
        401,
        "missing_auth_headers",
    ),
    "unknown api key": (lambda p: (_body(p), {"api_key": "nobody"}), 403, "invalid_api_key"),
    "malformed json": (lambda p: (b'{"order_id": 1,', {}), 400, "bad_request"),
    "not an object": (lambda p: (b"[1, 2]", {}), 400, "bad_request"),
    "NaN": (lambda p: (_body(p).replace(b'"status": "delivered"', b'"status": NaN'), {}), 400, "bad_request"),
    "missing order_id": (lambda p: (_body(p, order_id=_DROP), {}), 400, "bad_request"),
    "missing downstream_order_no": (lambda p: (_body(p, downstream_order_no=_DROP), {}), 400, "bad_request"),
    "missing status": (lambda p: (_body(p, status=_DROP), {}), 400, "bad_request"),
    "order_id as string": (
        lambda p: (_body(p, order_id=str(p["upstream_order_id"])), {}),
        400,
        "bad_request",
    ),
    "order_id as boolean": (lambda p: (_body(p, order_id=True), {}), 400, "bad_request"),
    "order_id fractional": (lambda p: (_body(p, order_id=1.5), {}), 400, "bad_request"),
    "empty downstream_order_no": (lambda p: (_body(p, downstream_order_no=""), {}), 400, "bad_request"),
    "status as number": (lambda p: (_body(p, status=5), {}), 400, "bad_request"),
    "fulfillment as string": (lambda p: (_body(p, fulfillment="cards"), {}), 400, "bad_request"),
    "payload as number": (
        lambda p: (_body(p, fulfillment={"type": "auto", "payload": 5}), {}),
        400,
        "bad_request",
    ),
    "delivery_data as list": (
        lambda p: (_body(p, fulfillment={"delivery_data": [1]}), {}),
        400,
        "bad_request",
    ),
    "timestamp as string": (lambda p: (_body(p, timestamp="now"), {}), 400, "bad_request"),
    "unknown order": (lambda p: (_body(p, downstream_order_no="NOPE"), {}), 404, "order_not_found"),
    "order_id mismatch": (
        lambda p: (_body(p, order_id=p["upstream_order_id"] + 1), {}),
        404,
        "order_not_found",
    ),
    "another upstream's key for this number": (
        lambda p: (_body(p), {"api_key": "second-key", "api_secret": "second-secret-value"}),
        404,
        "order_not_found",
    ),
    "oversize": (lambda p: (b"{" + b" " * MAX_BODY_BYTES + b"}", {}), 413, "payload_too_large"),
}


@pytest.mark.parametrize("case", list(BAD_CALLBACKS), ids=list(BAD_CALLBACKS))
async def test_bad_callback_is_rejected_without_any_change(stack: Stack, case: str) -> None:
    """Every malformed, unauthenticated or unmatched callback is refused with its status; nothing changes."""
    build, status, code = BAD_CALLBACKS[case]
    procurement = await submitted(stack)
    before, audit_before = await stack.order("C1"), await stack.operations.views.audit("C1")
    body, overrides = build(procurement)
    async with stack.signer() as signer:
        answer = await post(signer, body, **overrides)
    assert answer.status == status
    data = answer.json()
    assert data["ok"] is False
    assert data["error_code"] == code
    assert isinstance(data["message"], str)
    assert data["message"]
    assert await stack.order("C1") == before
    assert await stack.operations.views.audit("C1") == audit_before


async def test_rejections_are_counted_for_the_upstream_whose_key_was_used(stack: Stack) -> None:
    """A rejection counts for the upstream whose key was used; an unknown key counts in Prometheus only."""
    procurement = await submitted(stack)
    async with stack.signer() as signer:
        await post(signer, _body(procurement), signature="0" * 64)
        await post(signer, _body(procurement), api_key="nobody")
        await post(signer, _body(procurement))
    status = (await stack.admin("GET", "/api/v1/status")).body
    counts = {upstream["name"]: upstream["callbacks"] for upstream in status["upstreams"]}
    assert counts == {"main": {"accepted": 1, "rejected": 1}, "second": {"accepted": 0, "rejected": 0}}
    metrics = (await stack.admin("GET", "/metrics")).text
    instance = f'instance="{stack.runtime.instance}"'
    assert f'procurd_callbacks_total{{{instance},result="rejected",upstream="main"}} 1.0' in metrics
    rejections = "procurd_callback_rejections_total"
    assert f'{rejections}{{{instance},reason="invalid_api_key",upstream="unknown"}} 1.0' in metrics


async def test_streamed_oversize_body_is_refused_with_413(stack: Stack) -> None:
    """A chunked body without Content-Length is cut off at the size cap and refused with 413."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    names = HeaderNames.for_prefix("Service")
    headers = {
        names.api_key: "sandbox-key",
        names.timestamp: str(int(time.time())),
        names.signature: "0" * 64,
    }
    async with stack.session.post(
        stack.public_url + CALLBACK_PATH, data=chunks(), headers=headers
    ) as response:
        assert response.status == 413
        assert (await response.json())["error_code"] == "payload_too_large"


async def test_callback_signed_over_a_proxied_prefixed_path_is_verified(database_url: str) -> None:
    """Behind a proxy that strips a prefix, a callback signed over callback_url's own path is accepted."""
    proxy_sock = reserve_port()
    callback_url = url_of(proxy_sock) + "/shop" + CALLBACK_PATH
    async with procurd_stack(database_url, upstreams=("main",), callback_url=callback_url) as stack:
        await stack.sync("main")

        async def forward(request: web.Request) -> web.Response:
            headers = {name: value for name, value in request.headers.items() if name.lower() != "host"}
            target = stack.public_url + request.path.removeprefix("/shop")
            async with stack.session.post(target, data=await request.read(), headers=headers) as answer:
                return web.Response(
                    body=await answer.read(), status=answer.status, content_type="application/json"
                )

        proxy = web.Application()
        proxy.router.add_post("/shop/{tail:.*}", forward)
        async with serve(proxy, proxy_sock):
            procurement = await submitted(stack)
            body = delivered_body(stack, procurement["upstream_order_id"])
            answer = await stack.post_signed(callback_url, body, sign_path="/shop" + CALLBACK_PATH)
            assert (answer.status, answer.body) == (200, {"ok": True, "message": "received"})
            assert (await stack.order("C1"))["status"] == "delivered"


async def test_callback_url_path_is_served_too(database_url: str) -> None:
    """When callback_url has a path of its own, the receiver answers there too; the sandbox's push arrives."""
    async with procurd_stack(database_url, upstreams=("main",), callback_path="/hooks/upstream") as stack:
        await stack.sync("main")
        assert stack.settings.server.callback_url == stack.public_url + "/hooks/upstream"
        sku = stack.sandbox.state.first_sku("auto")
        await stack.admin(
            "POST", "/api/v1/orders", {"order_no": "H1", "items": [{"sku_id": sku.id, "quantity": 1}]}
        )
        assert await stack.submit_due()
        await stack.sandbox.wait_callbacks_idle()
        assert [(attempt.url, attempt.ok) for attempt in stack.sandbox.callback_log] == [
            (stack.settings.server.callback_url, True)
        ]
        assert (await stack.order("H1"))["status"] == "delivered"


async def test_rejection_is_logged_with_its_reason_but_no_secrets(stack: Stack) -> None:
    """A rejection's log line names the reason and upstream, never the body, payload or signature."""
    procurement = await submitted(stack)
    with captured_log("info") as stream:
        signature = "f" * 64
        async with stack.signer() as signer:
            answer = await post(
                signer, _body(procurement, fulfillment={"payload": "SECRET-CARD"}), signature=signature
            )
        assert answer.status == 401
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if "callback.rejected" in line]
    assert len(lines) == 1
    assert (lines[0]["reason"], lines[0]["upstream"]) == ("invalid_signature", "main")
    assert "SECRET-CARD" not in stream.getvalue()
    assert signature not in stream.getvalue()


async def test_unexpected_failure_answers_500_without_details(stack: Stack) -> None:
    """An unexpected error is answered 500 ``internal error`` as JSON, with no traceback in the answer."""
    procurement = await submitted(stack)
    await sql_execute(stack.runtime.database, text("DROP TABLE procurement_numbers"))
    async with stack.signer() as signer:
        answer = await post(signer, _body(procurement))
    assert answer.status == 500
    assert answer.json() == {"ok": False, "error_code": "internal_error", "message": "internal error"}


async def test_healthz_and_unknown_paths_answer_json(stack: Stack) -> None:
    """``/healthz`` answers ok; unknown paths and methods answer JSON 404 and 405, never HTML."""
    health = await stack.request("GET", stack.public_url + "/healthz")
    assert (health.status, health.body) == (200, {"ok": True})
    missing = await stack.request("GET", stack.public_url + "/nothing")
    assert (missing.status, missing.body["error_code"]) == (404, "not_found")
    wrong = await stack.request("GET", stack.public_url + CALLBACK_PATH)
    assert (wrong.status, wrong.body["error_code"]) == (405, "method_not_allowed")
    assert wrong.headers["Content-Type"].startswith("application/json")


async def test_empty_body_is_a_malformed_callback(stack: Stack) -> None:
    """A correctly signed callback with no body at all is a malformed body (400), not a server error."""
    answer = await stack.post_signed(stack.public_url + CALLBACK_PATH, b"")
    assert (answer.status, answer.body["error_code"]) == (400, "bad_request")
