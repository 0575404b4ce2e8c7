"""``procurd ping`` and ``procurd catalog sync`` from the command line, against the sandbox."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from procurd.db.database import Database
from procurd.db.schema import mirror_products, sync_runs
from procurd.sandbox import Sandbox, SandboxConfig
from support import run_procurd, screen_lines


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(products=30, site_name="CLI test site")) as sandbox:
        yield sandbox


def write_config(tmp_path: Path, database_url: str, sandbox: Sandbox, secret: str = "sandbox-secret") -> Path:
    path = tmp_path / "procurd.toml"
    path.write_text(
        f"""
[database]
url = "{database_url}"

[[upstreams]]
name = "main"
base_url = "{sandbox.base_url}"
api_key = "sandbox-key"
api_secret = "{secret}"
max_requests_per_second = 200
""",
        encoding="utf-8",
    )
    return path


async def procurd(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "procurd", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_ping_prints_the_upstream_facts(tmp_path: Path, database_url: str, sandbox: Sandbox) -> None:
    """ping shows site name, protocol version, balance with currency, member level and latency."""
    code, out, err = await procurd("--config", str(write_config(tmp_path, database_url, sandbox)), "ping")
    assert code == 0, err
    assert "CLI test site" in out
    assert "protocol version: 1.0" in out
    assert "1000.00 CNY" in out
    assert "member level:" in out
    assert "latency:" in out


async def test_ping_explains_a_wrong_secret(tmp_path: Path, database_url: str, sandbox: Sandbox) -> None:
    """A wrong secret is reported as invalid_signature with a hint, never showing the secret; exit 1."""
    config = write_config(tmp_path, database_url, sandbox, secret="wrong-secret-value")
    code, out, err = await procurd("--config", str(config), "ping")
    assert code == 1
    assert "invalid_signature" in err
    assert "api_secret" in err
    assert "wrong-secret-value" not in out + err


async def test_a_base_url_with_the_api_path_gets_the_hint(
    tmp_path: Path, database_url: str, sandbox: Sandbox
) -> None:
    """A base_url that ends in /api/v1/upstream (procurd appends it) finds no endpoint: ping and doctor
    say to check that base_url is the site root, exit 1."""
    config = tmp_path / "procurd.toml"
    good = write_config(tmp_path, database_url, sandbox).read_text(encoding="utf-8")
    doubled = sandbox.base_url + "/api/v1/upstream"
    config.write_text(good.replace(f'"{sandbox.base_url}"', f'"{doubled}"'), encoding="utf-8")
    hint = "check that base_url of main is the site root without /api/v1/upstream"
    code, _, err = await procurd("--config", str(config), "ping")
    assert code == 1
    assert "endpoint_not_found" in err
    assert hint in err
    code, out, _ = await procurd("--config", str(config), "doctor")
    assert code == 1
    assert "✗ upstream main: no answer: HTTP 404 endpoint_not_found" in out
    assert f"→ {hint}" in out


async def test_catalog_sync_mirrors_the_sandbox(
    tmp_path: Path, database_url: str, sandbox: Sandbox, database: Database
) -> None:
    """catalog sync mirrors every listed product and records an ok run."""
    config = str(write_config(tmp_path, database_url, sandbox))
    code, out, err = await procurd("--config", config, "catalog", "sync")
    assert code == 0, err
    assert "main: ok" in out
    products = await database.read(
        lambda tx: tx.connection.scalar(select(func.count()).select_from(mirror_products))
    )
    runs = await database.read(lambda tx: tx.connection.execute(select(sync_runs.c.status)).scalars().all())
    assert products == len(sandbox.state.active_products())
    assert runs == ["ok"]


async def test_catalog_sync_needs_a_migrated_database(tmp_path: Path, sandbox: Sandbox) -> None:
    """On a database that was never upgraded, sync says which command to run and exits 1."""
    config = str(write_config(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}", sandbox))
    code, _, err = await procurd("--config", config, "catalog", "sync")
    assert code == 1
    assert "procurd db upgrade" in err


async def test_catalog_sync_progress_on_a_terminal(tmp_path: Path, database_url: str) -> None:
    """On a terminal the progress bar ends at 100 %, and log lines appear above it, never inside it."""
    async with Sandbox(SandboxConfig(products=150)) as sandbox:
        config = write_config(tmp_path, database_url, sandbox)
        text = config.read_text(encoding="utf-8").replace(
            "max_requests_per_second = 200", "max_requests_per_second = 15"
        )
        config.write_text(text + "\n[catalog]\npage_size = 10\nconcurrency = 1\n", encoding="utf-8")
        code, out, _ = await run_procurd(
            "--config", str(config), "--log-level", "info", "--log-format", "json", "catalog", "sync",
            terminal_columns=80,
        )  # fmt: skip
    assert code == 0, out
    lines = screen_lines(out)
    assert any('"event": "catalog_sync_finished"' in line for line in lines), out[-2000:]
    assert not [line for line in lines if "━" in line and '"event"' in line]
    bars = [line for line in lines if "pages" in line and "━" in line]
    assert bars[-1].split()[-2] == "100%", bars[-1]
    assert "15/15" in bars[-1]
    assert any(line.startswith("main: ok") for line in lines)
