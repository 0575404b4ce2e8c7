"""The OpenAPI document is the contract: schemathesis, run against the document a real daemon serves (with an
admin token, the provider on, and records for requests to find), finds no disagreement with either listener;
the daemon serves the document with its own addresses; the mismatches once found answer as documented.

Schemathesis runs as a client developer runs it (the ``st`` command, in a process of its own), once for each
listener's paths, with the checks ``not_a_server_error``, ``response_schema_conformance``,
``negative_data_rejection``, ``unsupported_method``, ``status_code_conformance`` and
``content_type_conformance``, and ``positive_data_acceptance`` too: a valid request may only be refused for
naming something this installation does not have (an upstream, SKU, offer or price tier: documented answers,
listed in ``contract_hooks.UNKNOWN_REFERENCES``, which its hooks accept); any other refusal of a valid request
fails. Examples are bounded and generation deterministic (no seed, no example database), so a run is the
same each time; the daemon and the sandbox upstream run on loopback, and nothing else is reached.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.http.testing import procurd_stack
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.testing import SignedClient
from provider_support import ProviderSite, add_account, provider_settings, public_base_url, settled
from support import AdminClient, mirror, running_daemon

TOKEN = "contract-admin-token"
ACCOUNT = "contract-signer"
CHECKS = (
    "not_a_server_error",
    "response_schema_conformance",
    "negative_data_rejection",
    "unsupported_method",
    "status_code_conformance",
    "content_type_conformance",
    "positive_data_acceptance",
)
EXAMPLES = 10  # per operation: both runs take about 15 s on SQLite, 25 s on PostgreSQL
SIGNED_API = r"^/api/v1/upstream/"
TESTS = Path(__file__).parent


@dataclass
class Installation:
    """A daemon with an admin token and the provider on, in front of the sandbox."""

    settings: Settings
    daemon: Daemon
    sandbox: Sandbox
    account: ProviderSite

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.server.admin_port}"


@pytest.fixture
async def installation(database_url: str) -> AsyncIterator[Installation]:
    """The daemon with a delivered order, an exception, an offer and a provider order for generated requests
    to find (and their identifiers to learn from the answers)."""
    config = SandboxConfig(
        products=3,
        skus_per_product=2,
        manual_ratio=0,
        allow_private_callbacks=True,
        balance=Decimal("1000000"),
        callback_retry_delays=(0.1, 0.2, 0.3),
    )
    async with Sandbox(config) as sandbox:
        settings = provider_settings(
            database_url,
            ("main", sandbox),
            server={"admin_token": TOKEN},
            provider={"rate_limit_per_minute": 100_000},
        )
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            await settled(daemon)
            account = await add_account(daemon.operations, ACCOUNT, balance="100000.00")
            installation = Installation(settings, daemon, sandbox, account)
            await records(installation)
            yield installation


async def records(installation: Installation) -> None:
    """One order delivered, one an exception (its price above the limit), an offer, and a provider order."""
    sku = installation.sandbox.state.first_sku("auto").id
    async with aiohttp.ClientSession() as session:
        admin = AdminClient(installation.settings, session)
        await admin.submit("CT-1", {"sku_id": sku, "quantity": 1})
        await admin.submit("CT-2", {"sku_id": sku, "quantity": 1, "max_unit_price": "0.01"})
        offer = {"sources": [{"upstream": "main", "sku_id": sku}]}
        status, _ = await admin.call("PUT", "/api/v1/offers/CT-OFFER", offer)
        assert status == 201
        await admin.wait_status("CT-1", "delivered")
        await admin.wait_state("CT-2", "exception")
    account = installation.account
    async with SignedClient(account.base_url, account.api_key, account.api_secret) as client:
        [product, *_] = await client.list_all_products()
        answer = await client.create_order(product["skus"][0]["id"], downstream_order_no="CT-P1")
        assert answer.json()["ok"] is True, answer.json()


async def schemathesis(installation: Installation, tmp_path: Path, *selection: str) -> tuple[int, str]:
    """``st run`` against the document the daemon serves: its exit code and its report."""
    account = installation.account
    upstream = installation.settings.upstream("main")
    environ = dict(os.environ)
    environ.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), environ.get("PYTHONPATH", "")]),
        SCHEMATHESIS_HOOKS="contract_hooks",
        PROCURD_CONTRACT_ACCOUNT=json.dumps([account.header_prefix, account.api_key, account.api_secret]),
        PROCURD_CONTRACT_UPSTREAM=json.dumps([upstream.header_prefix, upstream.api_key, upstream.secret()]),
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text("[cache]\nenabled = false\n", encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color", "run",
        f"{installation.admin_url}/openapi.yaml",
        "--header", f"Authorization: Bearer {TOKEN}",
        "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing",
        "--max-examples", str(EXAMPLES),
        "--generation-deterministic",
        "--workers", "1",
        "--request-timeout", "30",
        *selection,
        cwd=tmp_path, env=environ, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


@pytest.mark.slow
async def test_schemathesis_finds_no_disagreement(installation: Installation, tmp_path: Path) -> None:
    """Every answer of both listeners to generated requests, valid and invalid, is the document's: no server
    error, each status, content type and body as documented, every invalid request refused, every valid one
    taken unless it names something that does not exist here, 405 for an undeclared method.

    The public listener's paths run first: the admin API's run may disable the signing account."""
    public_code, public = await schemathesis(installation, tmp_path, "--include-path-regex", SIGNED_API)
    assert public_code == 0, public
    admin_code, admin = await schemathesis(installation, tmp_path, "--exclude-path-regex", SIGNED_API)
    assert admin_code == 0, admin
    for report in (public, admin):
        assert " passed" in report, report
        assert "Tested: 0" not in report, report


async def test_the_daemon_serves_its_document(installation: Installation) -> None:
    """``GET /openapi.yaml`` on the admin listener needs the admin token, and answers the shipped document
    with this installation's addresses first: the admin listener where it was fetched, the public listener
    at the origin of ``callback_url``; the provider's signed API is in it while the provider is on."""
    url = f"{installation.admin_url}/openapi.yaml"
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as refused:
            assert refused.status == 401
        async with session.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as answer:
            assert answer.status == 200
            assert answer.content_type == "application/yaml"
            document: dict[str, Any] = json.loads(await answer.text())  # JSON, which YAML readers read too
    public = public_base_url(installation.settings)
    assert document["openapi"].startswith("3.1")
    assert document["servers"][0]["url"] == installation.admin_url
    paths = document["paths"]
    assert paths["/api/v1/upstream/callback"]["servers"][0]["url"] == public
    assert paths["/api/v1/upstream/ping"]["servers"][0]["url"] == public
    assert [server["url"] for server in paths["/healthz"]["servers"][:2]] == [installation.admin_url, public]
    assert "servers" not in paths["/api/v1/orders"]


async def test_without_the_provider_its_api_is_left_out(database_url: str) -> None:
    """With ``[provider] enabled`` off the served document has no signed API (those paths answer 404), and
    keeps everything else."""
    async with procurd_stack(database_url, admin_token=TOKEN) as stack:
        answer = await stack.admin("GET", "/openapi.yaml")
        signed = await stack.request("POST", stack.public_url + "/api/v1/upstream/ping")
    assert answer.status == 200
    paths = json.loads(answer.text)["paths"]
    assert "/api/v1/upstream/ping" not in paths
    assert "/api/v1/orders" in paths
    assert "/api/v1/upstream/callback" in paths
    assert signed.status == 404


# The reproducers of the mismatches schemathesis found once: (method, path, body) and the answer the
# document now gives them (status, error_code; None for a success).
HUGE_ID = 2**63 - 2
REPRODUCERS: list[tuple[str, str, Any, int, str | None]] = [
    ("GET", "/api/v1/alerts?kind=" + "0" * 63, None, 400, "unknown_kind"),
    ("GET", "/api/v1/exceptions?reason=" + "0" * 63, None, 400, "unknown_reason"),
    ("POST", "/api/v1/exceptions/retry", {}, 422, "filter_required"),
    ("POST", "/api/v1/exceptions/retry", {"upstream": None, "all": True}, 200, None),
    ("POST", "/api/v1/exceptions/1/resolve", {"note": "x", "extra": "\x00"}, 400, "invalid_request"),
    ("POST", "/api/v1/orders", {"order_no": "R1", "items": [{"upstream": "", "offer": "0", "quantity": 1}]},
     400, "invalid_request"),
    ("PUT", "/api/v1/offers/R1", {"sources": [{"upstream": "0", "sku_id": HUGE_ID}]}, 422,
     "unknown_upstream"),
    ("GET", "/api/v1/catalog/holds?upstream=", None, 400, "invalid_query"),
    ("GET", "/api/v1/offers?page=", None, 400, "invalid_query"),
    ("POST", "/api/v1/catalog/sync", {"upstream": None}, 400, "upstream_required"),
    ("POST", "/api/v1/provider/accounts/nobody/debit", {"amount": "0.0", "note": "n"}, 400, "invalid_amount"),
]  # fmt: skip


async def test_the_mismatches_found_answer_as_documented(database_url: str) -> None:
    """Each request schemathesis once found the document and the server disagreeing on is answered as the
    document now says; an undeclared method on the console answers 405 with ``Allow``, signed in or not, and
    one on the callback receiver 405 too."""
    async with procurd_stack(database_url, admin_token=TOKEN) as stack:
        for method, path, body, status, code in REPRODUCERS:
            answer = await stack.admin(method, path, body)
            assert (answer.status, answer.body.get("error_code")) == (status, code), (
                method,
                path,
                answer.body,
            )
        console = await stack.request("TRACE", stack.admin_url + "/ui/")
        callback = await stack.request("GET", stack.public_url + "/api/v1/upstream/callback")
    assert (console.status, console.headers["Allow"]) == (405, "GET,HEAD")
    assert (callback.status, callback.body["error_code"], callback.headers["Allow"]) == (
        405,
        "method_not_allowed",
        "POST",
    )


async def test_the_signed_apis_405_names_what_is_allowed() -> None:
    """A method the signed API does not take at a path it has answers 405 with ``Allow``."""
    async with Sandbox(SandboxConfig(products=1)) as sandbox, SignedClient(sandbox.base_url) as client:
        answer = await client.request("DELETE", "/orders/1")
    assert (answer.status, answer.error_code, answer.headers["Allow"]) == (405, "method_not_allowed", "GET")
