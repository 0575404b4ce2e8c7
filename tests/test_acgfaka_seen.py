"""What a person sees of an acg-faka upstream beside a Dujiao-Next one: ``procurd catalog sync``, ``ping``,
``probe``, ``status``, ``doctor`` and the metrics name each upstream's protocol; the probe says which
features an acg-faka shop's version has. The sandboxes of both protocols over real sockets, procurd's
command line on a real database."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from procurd.metrics import Metrics
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, DEFAULT_APP_KEY, AcgFakaSandbox, ShopConfig
from support import run_cli


@pytest.fixture
async def sites() -> AsyncIterator[tuple[Sandbox, AcgFakaSandbox, AcgFakaSandbox]]:
    """A Dujiao-Next site, an acg-faka shop of today (3.6.0) and one of 1.3.5 (before ``query``)."""
    async with (
        Sandbox(SandboxConfig(products=6)) as dujiao,
        AcgFakaSandbox(ShopConfig(commodities=16)) as shop,
        AcgFakaSandbox(ShopConfig(commodities=8, version="1.3.5")) as old,
    ):
        yield dujiao, shop, old


def write_config(tmp_path: Path, database_url: str, dujiao: Sandbox, *shops: AcgFakaSandbox) -> Path:
    blocks = [
        f'[[upstreams]]\nname = "main"\nbase_url = "{dujiao.base_url}"\napi_key = "{dujiao.config.api_key}"\n'
        f'api_secret = "{dujiao.config.api_secret}"\nmax_requests_per_second = 200\n'
    ]
    blocks += [
        f'[[upstreams]]\nname = "{name}"\nprotocol = "acg-faka"\nbase_url = "{shop.base_url}"\n'
        f'app_id = "{DEFAULT_APP_ID}"\napp_key = "{DEFAULT_APP_KEY}"\nmax_requests_per_second = 200\n'
        for name, shop in zip(("acg", "old"), shops, strict=False)
    ]
    path = tmp_path / "procurd.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n\n' + "\n".join(blocks), encoding="utf-8")
    return path


def by_upstream(out: str) -> dict[str, dict[str, Any]]:
    return {entry["upstream"]: entry for entry in json.loads(out)}


async def test_every_command_names_the_protocol(
    tmp_path: Path, database_url: str, sites: tuple[Sandbox, AcgFakaSandbox, AcgFakaSandbox]
) -> None:
    """Both protocols pass and ping; ``ping``, ``status`` (text and JSON), ``probe`` (text and JSON, with
    the same keys for both protocols and the acg-faka version's features) and the metrics name the
    protocol; nothing is bought."""
    dujiao, shop, old = sites
    config = write_config(tmp_path, database_url, dujiao, shop, old)
    result = await run_cli(config, "catalog", "sync")
    assert result.exit_code == 0, result.output
    assert shop.request_counts["items"] == 1
    # The shop leaves out a parent category without goods of its own: its children are mirrored at the top.
    assert "not as expected" not in result.output
    result = await run_cli(config, "catalog", "sync", "--upstream", "acg")
    assert result.exit_code == 0, result.output
    assert shop.request_counts["valuation"] > 0

    result = await run_cli(config, "ping")
    assert result.exit_code == 0, result.stderr
    assert "  protocol:         dujiao (Dujiao-Next's procurement API)" in result.stdout
    assert "  protocol:         acg-faka (an acg-faka shop's shared-shop API)" in result.stdout
    assert "  balance:          1000.00 CNY (the currency is the block's)" in result.stdout
    assert "warning" not in result.stderr

    result = await run_cli(config, "status", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    upstreams = {upstream["name"]: upstream for upstream in report["upstreams"]}
    assert {name: upstream["protocol"] for name, upstream in upstreams.items()} == {
        "main": "dujiao",
        "acg": "acg-faka",
        "old": "acg-faka",
    }
    assert upstreams["acg"]["mirror"]["products"] == 12  # 16 generated, the hidden and undocked left out
    # acg-faka has no updated_after: every pass is a full one, whatever incremental_sync says.
    assert (upstreams["acg"]["last_sync"]["status"], upstreams["acg"]["last_sync"]["kind"]) == ("ok", "full")
    result = await run_cli(config, "status")
    assert "  protocol      acg-faka (an acg-faka shop's shared-shop API)" in result.stdout
    assert "  callbacks     none (acg-faka calls nothing back" in result.stdout

    metrics = Metrics("test:1", lambda: {})
    metrics.set_status(report)
    rendered = metrics.render().decode()
    assert 'procurd_upstream_info{protocol="acg-faka",upstream="acg"} 1.0' in rendered
    assert 'procurd_upstream_info{protocol="dujiao",upstream="main"} 1.0' in rendered

    result = await run_cli(config, "probe", "--json")
    assert result.exit_code == 0, result.stderr
    found = by_upstream(result.stdout)
    assert {name: entry["protocol"] for name, entry in found.items()} == {
        "main": "dujiao",
        "acg": "acg-faka",
        "old": "acg-faka",
    }
    assert set(found["main"]) | {"features", "version_range"} == set(found["acg"])
    assert found["acg"]["features"] == {"valuation": True, "stock": True, "query": True, "item": "code"}
    assert found["acg"]["version_range"] == "3.4.6 or later"
    assert found["old"]["features"] == {"valuation": False, "stock": False, "query": False, "item": None}
    assert found["old"]["version_range"] == "before 1.3.6"
    assert (found["acg"]["requests"], found["acg"]["currency"]) == (5, "CNY")
    query = {point["point"]: point for point in found["old"]["points"]}["query"]
    assert (query["found"], query["ok"]) == ("no", False)

    result = await run_cli(config, "probe", "acg")
    assert result.stdout.startswith("acg: acg-faka 3.4.6 or later (valuation, stock, query, item by code)")
    assert shop.request_counts["trade"] == old.request_counts["trade"] == 0


async def test_doctor_names_the_protocol_and_the_version(
    tmp_path: Path, database_url: str, sites: tuple[Sandbox, AcgFakaSandbox, AcgFakaSandbox]
) -> None:
    """``doctor`` says which protocol each upstream was authenticated with, needs no clock for acg-faka,
    names the acg-faka version and warns about a shop without ``query``."""
    dujiao, shop, old = sites
    config = write_config(tmp_path, database_url, dujiao, shop, old)
    result = await run_cli(config, "doctor")
    lines = result.stdout.splitlines()

    def line(subject: str) -> str:
        return next(text for text in lines if f" {subject}: " in text)

    assert "(dujiao, " in line("upstream main")
    assert "(acg-faka, " in line("upstream acg")
    assert "not needed (acg-faka signs no time)" in line("upstream acg clock")
    assert "acg-faka 3.4.6 or later" in line("upstream acg version")
    assert line("upstream old version").startswith("⚠")
    assert "dialect" in line("upstream main dialect")
