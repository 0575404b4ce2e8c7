"""[[upstreams]] protocol = "acg-faka": its keys, the refusals naming the key, and a daemon that works for its
Dujiao-Next upstreams beside an acg-faka one, whose shop it pings and mirrors."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from procurd.cli.base import known_secrets
from procurd.config import ConfigError, Settings, load_settings
from procurd.protocol.acgfaka import AcgFakaClient
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.testing import shop_settings
from procurd.upstream import UpstreamError
from support import AdminClient, config_data, mirror, running_daemon, wait_until

DUJIAO = """
[[upstreams]]
name = "main"
base_url = "https://up.example.com"
api_key = "key-1"
api_secret = "secret-value-1"
"""
ACG = """
[[upstreams]]
name = "acg"
protocol = "acg-faka"
base_url = "https://supplier.example.com"
app_id = 1024
app_key = "8F3A2C9D1E7B6A54"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "procurd.toml"
    path.write_text(text)
    return path


def test_an_acg_faka_block(tmp_path: Path) -> None:
    """Its keys as INTERFACE.md gives them; prices in CNY unless currency says; a request budget of its own
    per shop and member; no api_secret, and its key masked in logs."""
    text = ACG + 'codes = ["8AE80574F3CA98BE"]\ntrade_timeout_seconds = 90\n' + DUJIAO
    settings = load_settings(write(tmp_path, text), environ={})
    acg, main = settings.upstreams
    assert (acg.protocol, main.protocol) == ("acg-faka", "dujiao")
    assert (acg.app_id, acg.currency, acg.codes, acg.trade_timeout_seconds) == (
        "1024",
        "CNY",
        ["8AE80574F3CA98BE"],
        90,
    )
    assert acg.signing_key() == "8F3A2C9D1E7B6A54"
    assert acg.budget_identity() == ("https://supplier.example.com/shared", "app_id:1024")
    assert main.budget_identity() == ("https://up.example.com/api/v1/upstream", "key-1")
    with pytest.raises(RuntimeError, match="speaks acg-faka"):
        acg.secret()
    assert "8F3A2C9D1E7B6A54" in known_secrets(settings)
    assert (
        load_settings(write(tmp_path, ACG + 'currency = "USD"\n'), environ={}).upstreams[0].currency == "USD"
    )


def test_app_key_file(tmp_path: Path) -> None:
    """app_key_file is read like api_secret_file: a bare name from the credentials directory."""
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials" / "acg").write_text("8F3A2C9D1E7B6A54\n")
    text = ACG.replace('app_key = "8F3A2C9D1E7B6A54"', 'app_key_file = "acg"')
    settings = load_settings(write(tmp_path, text), environ={})
    assert settings.upstreams[0].signing_key() == "8F3A2C9D1E7B6A54"
    missing = ACG.replace('app_key = "8F3A2C9D1E7B6A54"', 'app_key_file = "nope"')
    with pytest.raises(ConfigError, match=r"upstreams\[0\] \(acg\).app_key_file: file .*nope not found"):
        load_settings(write(tmp_path, missing), environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ACG.replace("app_id = 1024\n", ""),
            'upstreams[0] (acg): app_id: required for protocol = "acg-faka"',
        ),
        (ACG.replace('app_key = "8F3A2C9D1E7B6A54"\n', ""), "upstreams[0] (acg): app_key: missing"),
        (ACG + 'app_key_file = "k"\n', "app_key, app_key_file: both are set"),
        (ACG + 'api_key = "k"\n', "upstreams[0] (acg): api_key: belongs to Dujiao-Next upstreams only"),
        (ACG + 'header_prefix = "X"\n', "header_prefix: belongs to Dujiao-Next upstreams only"),
        (ACG + 'api_secret = "s"\n', "api_secret: belongs to Dujiao-Next upstreams only"),
        (
            DUJIAO + "app_id = 5\n",
            'upstreams[0] (main): app_id: belongs to upstreams with protocol = "acg-faka"',
        ),
        (DUJIAO + 'codes = ["A"]\n', 'codes: belongs to upstreams with protocol = "acg-faka"'),
        (DUJIAO.replace('api_key = "key-1"\n', ""), "upstreams[0] (main): api_key: required key is missing"),
        (ACG + 'codes = ["A", "A"]\n', "codes: 'A' is listed more than once"),
        (ACG + 'currency = "yuan"\n', "upstreams[0] (acg).currency:"),
        (ACG.replace("1024", '"10x"'), "upstreams[0] (acg).app_id:"),
        (ACG.replace('"8F3A2C9D1E7B6A54"', '"8F3A 2C9D"'), "app_key: must be the docking key as shown"),
        (ACG.replace('"acg-faka"', '"acg"'), "upstreams[0] (acg).protocol:"),
        (ACG + "trade_timeout_seconds = 0\n", "upstreams[0] (acg).trade_timeout_seconds:"),
    ],
)
def test_bad_configuration_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake names the file, the block, the key and the reason, and never shows the key's value."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    message = str(caught.value)
    assert str(path) in message
    assert expected in message
    assert "8F3A2C9D1E7B6A54" not in message


def test_acg_faka_blocks_share_no_api_key(tmp_path: Path) -> None:
    """Two acg-faka blocks (no api_key) are not two upstreams sharing one."""
    text = ACG + ACG.replace('name = "acg"', 'name = "acg2"').replace("1024", "1025")
    assert [u.name for u in load_settings(write(tmp_path, text), environ={}).upstreams] == ["acg", "acg2"]


async def test_clients_keep_to_their_protocol() -> None:
    """The Dujiao-Next client sends nothing to an acg-faka upstream; the acg-faka client takes no other."""
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as shop:
        settings = shop_settings(shop.base_url)
        async with UpstreamClient(settings) as client:
            with pytest.raises(UpstreamError) as caught:
                await client.ping()
        assert caught.value.code == "wrong_protocol"
        assert shop.request_counts["trade"] == 0
    with pytest.raises(ValueError, match="not acg-faka"):
        AcgFakaClient(settings.model_copy(update={"protocol": "dujiao"}))


async def test_the_daemon_beside_an_acg_faka_upstream(database_url: str) -> None:
    """With an acg-faka upstream configured, the daemon starts, buys from its Dujiao-Next upstream and takes
    its callbacks; the status and the console's overview name both protocols; the daemon pings and mirrors
    the acg-faka shop and buys nothing from it."""
    config = SandboxConfig(products=4, balance=Decimal("1000"), allow_private_callbacks=True)
    async with Sandbox(config) as sandbox, AcgFakaSandbox(ShopConfig(commodities=4)) as shop:
        data = config_data(database_url, ("main", sandbox))
        acg = {"name": "acg", "protocol": "acg-faka", "base_url": shop.base_url, "app_id": "1000"}
        data["upstreams"].append({**acg, "app_key": shop.config.app_key, "max_requests_per_second": 1000})
        settings = Settings(**data)
        await mirror(settings.model_copy(update={"upstreams": settings.upstreams[:1]}))
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            admin = AdminClient(settings, session)
            sku = sandbox.state.first_sku("auto").id
            await admin.submit("ACG-BESIDE-1", {"upstream": "main", "sku_id": sku, "quantity": 1})
            order = await admin.wait_status("ACG-BESIDE-1", "delivered")
            assert order["procurements"][0]["upstream"] == "main"
            await wait_until(lambda: any(attempt.ok for attempt in sandbox.callback_log))
            status, body = await admin.call("GET", "/api/v1/status")
            assert status == 200
            assert [u["name"] for u in body["upstreams"]] == ["main", "acg"]

            async def acg_mirrored() -> dict[str, Any] | None:
                _, body = await admin.call("GET", "/api/v1/status")
                found: dict[str, Any] = body["upstreams"][1]
                return found if found["last_sync"]["status"] == "ok" and found["last_ping"]["ok"] else None

            mirrored = await wait_until(acg_mirrored)
            assert (mirrored["protocol"], mirrored["mirror"]["products"]) == ("acg-faka", 4)
            overview = f"http://{settings.server.admin_host}:{settings.server.admin_port}/ui/"
            async with session.get(overview) as response:
                page = await response.text()
            assert response.status == 200
            main, acg_part = page.split('id="upstream-acg"', 1)
            assert '<p class="meta protocol">Dujiao-Next' in main
            assert '<p class="meta protocol">acg-faka shop · procurd acg-faka sandbox' in acg_part
        assert shop.request_counts["trade"] == 0
