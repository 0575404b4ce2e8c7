"""How the command line finds and reads its configuration, as an operator types the commands: messages that
name the right culprit, secrets read only when needed, from the same place the systemd unit loads them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from procurd.cli import main
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig
from support import wait_until

CONFIG = """
[database]
url = "{database_url}"

[server]
public_host = "127.0.0.1"
public_port = {public_port}
admin_host = "127.0.0.1"
admin_port = {admin_port}
callback_url = "http://127.0.0.1:{public_port}/api/v1/upstream/callback"
allow_private_callback_url = true
{server_extra}

[[upstreams]]
name = "main"
base_url = "{base_url}"
api_key = "sandbox-key"
{secret_line}
max_requests_per_second = 100
"""


def write_config(
    directory: Path,
    database_url: str,
    *,
    base_url: str = "http://127.0.0.1:9",
    secret_line: str = 'api_secret = "sandbox-secret"',
    server_extra: str = "",
    extra: str = "",
    **ports: int,
) -> Path:
    """A procurd.toml in ``directory``; ports default to two free ones."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "procurd.toml"
    public_port, admin_port = unused_ports(2)
    fields = {
        "database_url": database_url,
        "public_port": ports.get("public_port", public_port),
        "admin_port": ports.get("admin_port", admin_port),
        "base_url": base_url,
        "secret_line": secret_line,
        "server_extra": server_extra,
    }
    path.write_text(CONFIG.format(**fields) + extra, encoding="utf-8")
    return path


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without procurd's variables or systemd credentials, plus ``extra``."""
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PROCURD_") and name != "CREDENTIALS_DIRECTORY"
    }
    environ.update(extra)
    return environ


def procurd(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procurd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=dict(env) if env is not None else clean_environment(),
        cwd=cwd,
    )


async def procurd_async(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """The command, run while this test's event loop keeps serving (the sandbox answers meanwhile)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "procurd", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else clean_environment(),
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


# --- the environment ----------------------------------------------------------------------------------------


def test_a_bad_environment_value_blames_the_variable(tmp_path: Path) -> None:
    """An invalid PROCURD_SERVER__ADMIN_PORT is reported as that variable, not as a line of the file."""
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"))
    environ = clean_environment(PROCURD_SERVER__ADMIN_PORT="notanumber")
    result = procurd("--config", str(config), "db", "upgrade", env=environ)
    assert result.returncode == 2
    assert "environment variable PROCURD_SERVER__ADMIN_PORT: [server] admin_port:" in result.stderr
    assert f"{config}: [server] admin_port" not in result.stderr
    assert "Traceback" not in result.stderr


def test_other_procurd_variables_are_ignored(tmp_path: Path) -> None:
    """Variables of scripts and tests (PROCURD_VENV, PROCURD_CRASH_SEED, ...) change nothing and are not
    mentioned; every command works with them set."""
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"))
    environ = clean_environment(
        PROCURD_VENV="/opt/elsewhere",
        PROCURD_CRASH_SEED="7",
        PROCURD_HOSTILE_EXAMPLES="1000",
        PROCURD_TEST_SKIP_POSTGRES="1",
    )
    upgrade = procurd("--config", str(config), "db", "upgrade", env=environ)
    assert upgrade.returncode == 0, upgrade.stderr
    assert upgrade.stderr == ""
    status = procurd("--config", str(config), "status", env=environ)
    assert status.returncode == 0, status.stderr
    assert "PROCURD_" not in status.stdout + status.stderr


@pytest.mark.skipif(Path("/etc/procurd/procurd.toml").exists(), reason="this machine has a procurd.toml")
def test_no_configuration_file_says_where_it_looked(tmp_path: Path) -> None:
    """Without any configuration file the command says where it looked and to use --config (exit 2)."""
    result = procurd("status", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        f"no configuration file found (looked in: {tmp_path / 'procurd.toml'}, /etc/procurd/procurd.toml); "
        "use --config" in result.stderr
    )
    assert "upstreams" not in result.stderr


@pytest.mark.parametrize(
    ("public_host", "admin_host", "clash"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("0.0.0.0", "127.0.0.1", True),
        ("localhost", "127.0.0.1", True),
        ("127.0.0.2", "127.0.0.1", False),
    ],
)
def test_one_port_for_both_listeners_is_a_configuration_error(
    tmp_path: Path, public_host: str, admin_host: str, clash: bool
) -> None:
    """public_port == admin_port on overlapping hosts stops the program with exit 2 before it listens; on
    two distinct addresses it is allowed."""
    (port,) = unused_ports(1)
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"), public_port=port, admin_port=port)
    text = config.read_text(encoding="utf-8")
    text = text.replace('public_host = "127.0.0.1"', f'public_host = "{public_host}"')
    config.write_text(text.replace('admin_host = "127.0.0.1"', f'admin_host = "{admin_host}"'), "utf-8")
    result = procurd("--config", str(config), "db", "upgrade")
    if clash:
        assert result.returncode == 2
        assert f"{config}: [server] admin_port: {port} is also public_port" in result.stderr
        assert "address already in use" not in result.stderr
    else:
        assert result.returncode == 0, result.stderr


def test_log_level_critical_is_accepted(tmp_path: Path) -> None:
    """--log-level accepts every level [logging] level does, critical included."""
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"))
    result = procurd("--log-level", "critical", "--config", str(config), "db", "upgrade")
    assert result.returncode == 0, result.stderr


def leaf_commands(group: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    import click

    assert isinstance(group, click.Group)
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += leaf_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def test_every_configured_command_takes_config_after_it() -> None:
    """Every command that reads the configuration accepts --config, --log-level and --log-format after its
    name as well as before it."""
    runner = CliRunner()
    commands = [path for path in leaf_commands(main) if path not in (("sandbox",), ("demo",))]
    assert ("status",) in commands
    assert ("db", "upgrade") in commands
    try:
        for path in commands:
            result = runner.invoke(main, [*path, "--help"])
            assert result.exit_code == 0, (path, result.output)
            for option in ("--config", "--log-level", "--log-format"):
                assert option in result.output, (path, option)
    finally:
        configure_logging("warning", "json")


def test_config_after_the_subcommand(tmp_path: Path) -> None:
    """``procurd db upgrade --config X`` and ``procurd status --config X`` read X; the later --config wins."""
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"))
    upgrade = procurd("db", "upgrade", "--config", str(config), cwd=tmp_path.parent)
    assert upgrade.returncode == 0, upgrade.stderr
    status = procurd("--config", str(tmp_path / "none.toml"), "status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    assert "main" in status.stdout


# --- secrets ----------------------------------------------------------------------------------------------


def test_database_commands_do_not_need_upstream_secrets(tmp_path: Path) -> None:
    """status, exceptions list and order show work with a secret file nobody can read here; ping, which
    talks to the upstream, stops with exit 2 naming the key and the file it looked for."""
    secret_line = 'api_secret_file = "main"'
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"), secret_line=secret_line)
    assert procurd("--config", str(config), "db", "upgrade").returncode == 0
    status = procurd("--config", str(config), "status")
    assert status.returncode == 0, status.stderr
    listing = procurd("--config", str(config), "exceptions", "list")
    assert (listing.returncode, listing.stdout.strip()) == (0, "no open exceptions"), listing.stderr
    missing = procurd("--config", str(config), "order", "show", "NOPE")
    assert missing.returncode == 1
    assert "order_not_found" in missing.stderr
    ping = procurd("--config", str(config), "ping")
    assert ping.returncode == 2
    expected = f"upstreams[0] (main).api_secret_file: file {tmp_path / 'credentials' / 'main'} not found"
    assert expected in ping.stderr


async def test_secrets_come_from_the_units_credentials(tmp_path: Path) -> None:
    """Bare secret file names are read from $CREDENTIALS_DIRECTORY when systemd sets it, else from the
    credentials directory beside the configuration file (where the unit's LoadCredential= reads them)."""
    async with Sandbox(SandboxConfig(products=2, site_name="credentials site")) as sandbox:
        config = write_config(
            tmp_path / "etc",
            sqlite_url(tmp_path / "procurd.db"),
            base_url=sandbox.base_url,
            secret_line='api_secret_file = "main"',
        )
        beside = tmp_path / "etc" / "credentials"
        beside.mkdir()
        (beside / "main").write_text("sandbox-secret\n", encoding="utf-8")
        code, _, err = await procurd_async("--config", str(config), "db", "upgrade")
        assert code == 0, err
        code, out, err = await procurd_async("--config", str(config), "ping")
        assert code == 0, err
        assert "credentials site" in out

        systemd = tmp_path / "run-credentials"
        systemd.mkdir()
        (systemd / "main").write_text("wrong-secret-value", encoding="utf-8")
        environ = clean_environment(CREDENTIALS_DIRECTORY=str(systemd))
        code, out, err = await procurd_async("--config", str(config), "ping", env=environ)
        assert code == 1
        assert "invalid_signature" in err
        assert "wrong-secret-value" not in out + err


@pytest.mark.parametrize(("section", "key"), [("server", "admin_token"), ("storefront", "webhook_secret")])
def test_a_secret_and_its_file_together_is_an_error(tmp_path: Path, section: str, key: str) -> None:
    """Setting both ``KEY`` and ``KEY_file`` stops the program with exit 2 naming both keys."""
    extra = f'\n{key} = "a-secret-value"\n{key}_file = "{key}"\n'
    if section == "server":
        config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"), server_extra=extra)
    else:
        config = write_config(
            tmp_path,
            sqlite_url(tmp_path / "procurd.db"),
            extra=f'\n[storefront]\nwebhook_url = "https://shop.example.com/events"{extra}',
        )
    result = procurd("--config", str(config), "db", "upgrade")
    assert result.returncode == 2
    assert f"{key}, {key}_file: both are set" in result.stderr
    assert "a-secret-value" not in result.stderr


async def test_admin_token_file_guards_the_admin_listener(tmp_path: Path) -> None:
    """``procurd run`` with [server] admin_token_file (a credential) answers 401 without that token and 200
    with it; the token never reaches the log."""
    token = "token-from-a-credential-file"
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "admin").write_text(token + "\n", encoding="utf-8")
    public_port, admin_port = unused_ports(2)
    async with Sandbox(SandboxConfig(products=2, allow_private_callbacks=True)) as sandbox:
        config = write_config(
            tmp_path,
            sqlite_url(tmp_path / "procurd.db"),
            base_url=sandbox.base_url,
            server_extra='admin_token_file = "admin"',
            public_port=public_port,
            admin_port=admin_port,
        )
        environ = clean_environment(CREDENTIALS_DIRECTORY=str(credentials))
        assert procurd("--config", str(config), "db", "upgrade", env=environ).returncode == 0
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", "--config", str(config), "--log-level", "debug", "run",
            env=environ, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            status_url = f"http://127.0.0.1:{admin_port}/api/v1/status"
            async with aiohttp.ClientSession() as session:

                async def answers() -> int | None:
                    try:
                        async with session.get(status_url) as response:
                            return response.status
                    except aiohttp.ClientError:
                        return None

                assert await wait_until(answers, timeout=30) == 401
                headers = {"Authorization": f"Bearer {token}"}
                async with session.get(status_url, headers=headers) as response:
                    assert response.status == 200
        finally:
            process.terminate()
            _, raw_stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    stderr = raw_stderr.decode()
    assert process.returncode == 0, stderr
    assert token not in stderr


# --- where the database lives -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["db", "upgrade"], ["run"], ["status"]])
@pytest.mark.parametrize("case", ["under /proc", "below a file"])
def test_an_impossible_sqlite_path_is_one_line(tmp_path: Path, command: list[str], case: str) -> None:
    """A SQLite path that cannot be created is one line naming the path and the reason, exit 2."""
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    database = Path("/proc/nope/x.db") if case == "under /proc" else tmp_path / "a-file" / "sub" / "x.db"
    config = write_config(tmp_path, sqlite_url(database))
    result = procurd("--config", str(config), *command)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    if case == "under /proc":
        assert line == (
            f"procurd: {config}: [database] url: cannot create the directory /proc/nope: "
            "No such file or directory"
        )
    else:
        assert line == f"procurd: {config}: [database] url: {tmp_path / 'a-file'} is not a directory"


def test_demo_in_an_impossible_directory_is_one_line(tmp_path: Path) -> None:
    """``procurd demo --dir`` somewhere that cannot be created is one line, exit 2."""
    result = procurd("demo", "--dir", "/proc/nope")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "procurd: --dir /proc/nope: cannot create the directory /proc/nope: No such file or directory"
    ]
