"""``procurd probe``: what each upstream speaks, from a read-only conversation, against the sandbox in both
dialects; and what passes, pings and the limiter's answers teach ``procurd status`` and ``procurd doctor``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from procurd.sandbox import Sandbox, SandboxConfig
from support import run_cli

UPSTREAMS = ("old", "new")  # a seed 000 site and a Dujiao-Next of 2026 site, side by side


@pytest.fixture
async def sites() -> AsyncIterator[dict[str, Sandbox]]:
    """Two sandboxes of 30 products, one speaking each dialect."""
    async with (
        Sandbox(SandboxConfig(products=30, api_key="old-key", dialect="seed")) as old,
        Sandbox(SandboxConfig(products=30, api_key="new-key", dialect="2026")) as new,
    ):
        yield {"old": old, "new": new}


def write_config(tmp_path: Path, database_url: str, sites: dict[str, Sandbox], rate: float = 200) -> Path:
    blocks = "".join(
        f"""
[[upstreams]]
name = "{name}"
base_url = "{site.base_url}"
api_key = "{site.config.api_key}"
api_secret = "{site.config.api_secret}"
max_requests_per_second = {rate}
"""
        for name, site in sites.items()
    )
    path = tmp_path / "procurd.toml"
    path.write_text(f'[database]\nurl = "{database_url}"\n{blocks}', encoding="utf-8")
    return path


async def run_procurd(config: str, *args: str) -> tuple[int, str, str]:
    """``procurd --config CONFIG ARGS`` (in a thread of this process): exit code, stdout, stderr."""
    result = await run_cli(Path(config), *args)
    return result.exit_code, result.stdout, result.stderr


def by_upstream(out: str) -> dict[str, dict[str, Any]]:
    found = json.loads(out)
    assert isinstance(found, list)
    return {entry["upstream"]: entry for entry in found}


async def test_probe_json_against_both_dialects(
    tmp_path: Path, database_url: str, sites: dict[str, Sandbox]
) -> None:
    """``probe --json`` prints one object per upstream: the seed site serves no include_inactive, allows
    pages of 50 and answers 404 for the product off sale its mirror knows; the 2026 site serves
    include_inactive (the product off sale listed), allows 50 and answers 200. Nothing is ordered, a
    handful of requests is sent, and the clock offset, currency and member level are the ping's."""
    config = str(write_config(tmp_path, database_url, sites))
    code, out, err = await run_procurd(config, "catalog", "sync")
    assert code == 0, err
    for site in sites.values():
        site.state.set_product_active(3, False)
    code, out, err = await run_procurd(config, "catalog", "sync", "--full")
    assert code == 0, err
    for site in sites.values():
        site.reset_requests()
    code, out, err = await run_procurd(config, "probe", "--json")
    assert code == 0, err
    found = by_upstream(out)
    assert sorted(found) == sorted(UPSTREAMS)
    old, new = found["old"], found["new"]
    for entry in (old, new):
        assert (entry["ok"], entry["protocol_version"], entry["currency"]) == (True, "1.0", "CNY")
        assert isinstance(entry["clock_offset_seconds"], float)
        assert abs(entry["clock_offset_seconds"]) < 30
        assert entry["member_level"]["slug"] == "gold"
        assert entry["page_size_max"] == 50
    assert (old["include_inactive"], old["inactive_detail"], old["dialect"]) == (False, "404", "seed")
    assert (new["include_inactive"], new["inactive_detail"], new["dialect"]) == (True, "200", "2026")
    for name, site in sites.items():
        assert site.state.orders == {}
        assert site.request_counts["orders.create"] == 0
        assert site.request_counts["*"] == found[name]["requests"] <= 4
    assert [point["point"] for point in new["points"]][:3] == [
        "protocol version", "clock offset", "include_inactive"
    ]  # fmt: skip


async def test_probe_of_one_upstream_for_a_person(
    tmp_path: Path, database_url: str, sites: dict[str, Sandbox]
) -> None:
    """``probe new`` names the dialect in its first line and says what procurd does about each point."""
    sites["new"].state.set_product_active(3, False)
    config = str(write_config(tmp_path, database_url, sites))
    code, out, err = await run_procurd(config, "probe", "new")
    assert code == 0, err
    first, *rest = out.splitlines()
    assert first.startswith("new: Dujiao-Next of 2026 (includes_inactive, page size 50")
    assert "nothing ordered" in first
    text = "\n".join(rest)
    assert "made inactive by the next pass, incremental ones included" in text
    assert "200 with is_active: false: read as inactive" in text
    assert "old" not in out


async def test_probe_exit_codes_are_pings(
    tmp_path: Path, database_url: str, sites: dict[str, Sandbox]
) -> None:
    """An upstream that cannot be reached: exit 1, its object with ok false and the error, the other's
    still probed; an unknown upstream name is a usage error (2)."""
    unreachable = dict(sites)
    config = write_config(tmp_path, database_url, unreachable)
    text = config.read_text(encoding="utf-8").replace(sites["old"].base_url, "http://127.0.0.1:9")
    config.write_text(text, encoding="utf-8")
    code, out, err = await run_procurd(str(config), "probe", "--json")
    assert code == 1, err
    found = by_upstream(out)
    assert (found["old"]["ok"], found["old"]["include_inactive"]) == (False, False)
    assert "network_error" in found["old"]["error"]
    assert found["new"]["ok"] is True
    code, _, err = await run_procurd(str(config), "probe", "nowhere")
    assert code == 2
    assert "no upstream named 'nowhere'" in err


async def test_status_and_doctor_show_what_was_learned(
    tmp_path: Path, database_url: str, sites: dict[str, Sandbox]
) -> None:
    """A catalogue pass and a ping teach what each upstream speaks, an answer over the limit its HTTP status:
    ``doctor`` and ``status`` name the dialect, ``status --json`` shows each point per upstream."""
    config = str(write_config(tmp_path, database_url, sites))
    for name in UPSTREAMS:
        code, _, err = await run_procurd(config, "catalog", "sync", "--upstream", name)
        assert code == 0, err
    code, out, err = await run_procurd(config, "doctor")
    assert code == 0, out + err
    assert "✔ upstream old dialect: seed 000 (no includes_inactive, page size 50)" in out
    assert "✔ upstream new dialect: Dujiao-Next of 2026 (includes_inactive, page size 50)" in out

    new = sites["new"]
    new.config.rate_limit, new.config.rate_limit_requests = True, 1
    new.rate_limiter.reset()
    code, _, err = await run_procurd(config, "ping", "--upstream", "new")
    assert code == 0, err
    code, _, err = await run_procurd(config, "ping", "--upstream", "new")
    assert code == 1
    assert "HTTP 429 rate_limited" in err
    code, out, err = await run_procurd(config, "status", "--json")
    assert code == 0, err
    report = {upstream["name"]: upstream for upstream in json.loads(out)["upstreams"]}
    old, learned = report["old"]["dialect"], report["new"]["dialect"]
    assert (old["name"], old["includes_inactive"], old["page_size"], old["limiter_status"]) == (
        "seed", False, 50, None
    )  # fmt: skip
    assert (learned["name"], learned["includes_inactive"], learned["limiter_status"]) == ("2026", True, 429)
    assert (learned["protocol_version"], learned["currency"]) == ("1.0", "CNY")
    assert learned["learned_at"] is not None
    code, out, _ = await run_procurd(config, "status")
    assert "Dujiao-Next of 2026 (includes_inactive, page size 50, limiter HTTP 429)" in out
