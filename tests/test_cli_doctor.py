"""``procurd doctor`` against the sandbox: one line per check, ✔ or ✗ with what to do, exit 0 only when all
pass."""

from __future__ import annotations

import os
from pathlib import Path

from procurd.cli.doctor import (
    DOCTOR_CHECKS,
    check_alert_urls,
    check_configuration,
    check_database_ready,
    check_upstreams,
)
from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig
from support import run_procurd
from test_alerts import receiving

SECRET = "sandbox-secret"


def write_config(directory: Path, database_url: str, base_url: str, secret_line: str) -> Path:
    public, admin = unused_ports(2)
    path = directory / "procurd.toml"
    path.write_text(
        f"""
[database]
url = "{database_url}"

[server]
public_port = {public}
admin_port = {admin}
callback_url = "http://127.0.0.1:{public}/api/v1/upstream/callback"
allow_private_callback_url = true

[[upstreams]]
name = "main"
base_url = "{base_url}"
api_key = "sandbox-key"
{secret_line}
""",
        encoding="utf-8",
    )
    return path


def without_procurd_variables() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("PROCURD_")}


async def doctor(config: Path) -> tuple[int, list[str], str]:
    code, out, err = await run_procurd("--config", str(config), "doctor", env=without_procurd_variables())
    return code, out.splitlines(), err


def test_the_checks_are_a_list_to_extend() -> None:
    """The checks doctor runs are one list of functions, in order (another check is appended there)."""
    assert [check_configuration, check_database_ready, check_upstreams, check_alert_urls] == DOCTOR_CHECKS


async def test_a_ready_installation_passes(tmp_path: Path, database_url: str) -> None:
    """Good credentials and a migrated database: every line is a ✔ (configuration, database, upstream,
    balance, clock, the dialect it speaks as far as its answers showed it) and the exit code is 0."""
    async with Sandbox(SandboxConfig(products=2, site_name="doctor site")) as sandbox:
        config = write_config(tmp_path, database_url, sandbox.base_url, f'api_secret = "{SECRET}"')
        code, lines, err = await doctor(config)
    assert code == 0, "\n".join(lines) + err
    checks = lines[:-1]
    assert all(line.startswith("✔ ") for line in checks), lines
    assert checks[0].startswith(f"✔ configuration: {config}: 1 upstream, ")
    assert checks[1].startswith("✔ database: reachable, at the current revision")
    assert checks[2].startswith("✔ upstream main: authenticated at doctor site")
    assert checks[3] == "✔ upstream main balance: 1000.00 CNY"
    assert checks[4].startswith("✔ upstream main clock: this machine is ")
    assert checks[5] == (
        "✔ upstream main dialect: not learned yet (a catalogue pass or `procurd probe` learns it)"
    )
    assert checks[6].startswith("✔ alerts: no [alerts] urls")
    assert lines[-1] == "all 7 checks passed"
    assert err == ""


async def test_a_wrong_secret_fails_with_what_to_check(tmp_path: Path, database_url: str) -> None:
    """A wrong API secret: ✗ on the upstream with the hint (check api_secret), never the secret; exit 1."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        config = write_config(tmp_path, database_url, sandbox.base_url, 'api_secret = "wrong-secret-value"')
        code, lines, err = await doctor(config)
    assert code == 1
    [failure] = [index for index, line in enumerate(lines) if line.startswith("✗")]
    assert lines[failure] == "✗ upstream main: authentication failed: invalid_signature"
    assert lines[failure + 1].startswith("    → check api_secret of main")
    assert lines[-1] == "1 check of 5 failed"
    assert "wrong-secret-value" not in "\n".join(lines) + err


async def test_an_unmigrated_database_fails(tmp_path: Path) -> None:
    """A database file that does not exist (doctor does not create it), then an empty one: ✗ database with
    the command that fixes it, exit 1; the upstream is not checked (its request budget is shared through the
    database), and doctor says what to do first."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        database_url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        config = write_config(tmp_path, database_url, sandbox.base_url, f'api_secret = "{SECRET}"')
        missing_code, missing, _ = await doctor(config)
        (tmp_path / "empty.db").touch()
        code, lines, _ = await doctor(config)
    assert missing_code == 1
    index = missing.index(f"✗ database: the database {tmp_path / 'empty.db'} does not exist")
    assert missing[index + 1] == "    → run `procurd db upgrade` to create it"
    assert code == 1
    index = lines.index("✗ database: empty; this version needs revision " + lines[1].rsplit(" ", 1)[-1])
    assert lines[index + 1] == "    → run `procurd db upgrade`"
    upstream = lines.index("✗ upstream main: not checked")
    assert lines[upstream + 1] == "    → make the database usable first"


async def test_a_missing_secret_file_fails_the_configuration(tmp_path: Path, database_url: str) -> None:
    """A secret file that is not there: ✗ configuration naming the file, the database is still checked, the
    upstream is not (exit 1)."""
    config = write_config(tmp_path, database_url, "http://127.0.0.1:9", 'api_secret_file = "main"')
    code, lines, _ = await doctor(config)
    assert code == 1
    assert lines[0].startswith("✗ configuration: ")
    assert f"file {tmp_path / 'credentials' / 'main'} not found" in lines[0]
    assert lines[2].startswith("✔ database: reachable")
    assert lines[3] == "✗ upstream main: not checked"


async def test_alert_urls_are_checked_without_sending(tmp_path: Path, database_url: str) -> None:
    """Each [alerts] url is checked: a host that answers is ✔, one that refuses the connection is ✗ with
    what to do; no message is sent; a password in a URL is never printed."""
    async with (
        Sandbox(SandboxConfig(products=1)) as sandbox,
        receiving() as receiver,
    ):
        dead = f"json://user:hunter2-secret@127.0.0.1:{unused_ports(1)[0]}/alerts"
        config = write_config(tmp_path, database_url, sandbox.base_url, f'api_secret = "{SECRET}"')
        with config.open("a", encoding="utf-8") as text:
            text.write(f'\n[alerts]\nurls = ["{receiver.url}", "{dead}"]\n')
        code, lines, err = await doctor(config)
    assert code == 1
    alert_lines = [line for line in lines if "alerts json://" in line]
    assert alert_lines[0].startswith("✔ alerts json://127.0.0.1:")
    assert alert_lines[0].endswith("reachable")
    assert alert_lines[1].startswith("✗ alerts json://")
    assert "[alerts] urls" in lines[lines.index(alert_lines[1]) + 1]
    assert receiver.messages == []
    assert "hunter2-secret" not in "\n".join(lines) + err
