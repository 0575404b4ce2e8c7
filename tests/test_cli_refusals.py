"""Every refusal is one clear line that names the right place: the commands as a person types them, their
exit code and the exact line; on a terminal a one-shot command shows its answer alone (its log lines go
where log lines were asked for); counts agree with their nouns; nothing is left behind by a refusal."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

from procurd.daemon import Daemon
from procurd.db.revision import HEAD_REVISION
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier
from scale_cluster import settings_of, to_toml
from support import config_data, mirror, run_procurd, screen_lines, wait_until

PROBLEM_FREE = {"name": "main", "base_url": "http://127.0.0.1:9", "api_key": "k", "api_secret": "s"}


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without procurd's variables, plus ``extra``."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("PROCURD_")}
    environ.update(extra)
    return environ


def write_config(directory: Path, database_url: str, *sandboxes: tuple[str, Sandbox]) -> Path:
    """A procurd.toml on ``database_url``: one upstream per sandbox, or one that nobody answers."""
    data = config_data(database_url, *sandboxes)
    if not sandboxes:
        data["upstreams"] = [dict(PROBLEM_FREE)]
    path = directory / "procurd.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    return path


def sqlite_url(path: Path | str) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def one_line(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """The exit code and the one line a command printed on a terminal (it printed nothing else)."""
    code, output, _ = await run_procurd(*args, env=env or environment(), terminal_columns=400, cwd=cwd)
    lines = [line for line in screen_lines(output) if line]
    assert len(lines) == 1, lines
    return code, lines[0]


# --- where the database is --------------------------------------------------------------------------------


async def test_a_database_path_from_the_environment_blames_the_variable(tmp_path: Path) -> None:
    """A SQLite path in PROCURD_DATABASE__URL whose directory cannot be created names the variable, not the
    file, exit 2."""
    config = write_config(tmp_path, sqlite_url(tmp_path / "procurd.db"))
    env = environment(PROCURD_DATABASE__URL=sqlite_url("/proc/nope/x.db"))
    assert await one_line("--config", str(config), "status", env=env) == (
        2,
        "procurd: environment variable PROCURD_DATABASE__URL: [database] url: cannot create the directory "
        "/proc/nope: No such file or directory",
    )


async def test_a_database_never_set_up_is_named_and_not_created(tmp_path: Path) -> None:
    """`status` (and `run`) on a SQLite file that does not exist say so with its path and the command that
    creates it, exit 1, and leave no file behind; only `db upgrade` creates it."""
    database = tmp_path / "data" / "procurd.db"
    config = write_config(tmp_path, sqlite_url(database))
    expected = f"the database {database} does not exist: run `procurd db upgrade` to create it"
    assert await one_line("--config", str(config), "status") == (1, f"procurd: {expected}")
    assert await one_line("--config", str(config), "run") == (1, f"procurd: not starting: {expected}")
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == []
    assert await one_line("--config", str(config), "db", "upgrade") == (
        0,
        f"database migrated from empty to revision {HEAD_REVISION}",
    )
    assert database.exists()


async def test_a_relative_database_path_is_said_to_be_relative_to_the_working_directory(
    tmp_path: Path,
) -> None:
    """A relative SQLite path that finds no file from where the command runs (the database is beside the
    configuration, the command runs elsewhere) is named as relative to the working directory, with the
    absolute path it resolved to and how to name the real one, before `procurd db upgrade` is suggested."""
    beside = tmp_path / "etc"
    beside.mkdir()
    config = write_config(beside, "sqlite+aiosqlite:///procurd.db")
    assert await one_line("--config", str(config), "db", "upgrade", cwd=beside) == (
        0,
        f"database migrated from empty to revision {HEAD_REVISION}",
    )
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    code, line = await one_line("--config", str(config), "status", cwd=elsewhere)
    assert (code, line) == (
        1,
        f"procurd: the database {elsewhere / 'procurd.db'} does not exist ([database] url names the relative "
        f"path procurd.db, which is relative to the working directory {elsewhere}; if the database is "
        "elsewhere, run procurd from its directory or give its absolute path, "
        "sqlite+aiosqlite:////absolute/path.db with four slashes): run `procurd db upgrade` to create it",
    )
    assert list(elsewhere.iterdir()) == []
    code, _, _ = await run_procurd("--config", str(config), "status", env=environment(), cwd=beside)
    assert code == 0


async def test_a_sqlite_file_that_cannot_be_used_is_named_with_the_reason(tmp_path: Path) -> None:
    """A file SQLite cannot create says so with its path and the system's reason; a file that is not a
    database says that, with its path (exit 1 both)."""
    config = write_config(tmp_path, sqlite_url("/proc/x.db"))
    assert await one_line("--config", str(config), "db", "upgrade") == (
        1,
        "procurd: database error: /proc/x.db: cannot create the file: No such file or directory",
    )
    not_a_database = tmp_path / "notes.db"
    not_a_database.write_text("hello, this is not SQLite\n" * 100, encoding="utf-8")
    config = write_config(tmp_path, sqlite_url(not_a_database))
    line = f"database error: {not_a_database} is not a SQLite database"
    assert await one_line("--config", str(config), "status") == (1, f"procurd: {line}")
    assert await one_line("--config", str(config), "run") == (1, f"procurd: not starting: {line}")


# --- the configuration ------------------------------------------------------------------------------------


async def test_a_directory_for_the_configuration_is_one_message_either_way(tmp_path: Path) -> None:
    """`--config DIR` and `PROCURD_CONFIG=DIR` are refused with the same line, exit 2."""
    expected = (2, f"procurd: configuration error: {tmp_path}: is a directory, not a TOML file")
    assert await one_line("--config", str(tmp_path), "status") == expected
    assert await one_line("status", env=environment(PROCURD_CONFIG=str(tmp_path))) == expected


async def test_an_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    """A misspelt key (in the file or in a variable) and a misspelt section get "did you mean"; one line per
    problem under the heading, exit 2."""
    config = tmp_path / "procurd.toml"
    config.write_text(
        to_toml({"catlog": {"page_size": 10}, "upstreams": [{**PROBLEM_FREE, "api_secert": "x"}]}), "utf-8"
    )
    code, output, _ = await run_procurd(
        "--config",
        str(config),
        "status",
        env=environment(PROCURD_SERVER__ADMIN_PROT="1"),
        terminal_columns=400,
    )
    assert code == 2
    assert [line for line in screen_lines(output) if line] == [
        "procurd: configuration error",
        "environment variable PROCURD_SERVER__ADMIN_PROT: [server] admin_prot: unknown key (did you mean "
        "admin_port?)",
        f"{config}: upstreams[0] (main).api_secert: unknown key (did you mean api_secret?)",
        f"{config}: [catlog]: unknown section (did you mean catalog?)",
    ]


# --- a one-shot command on a terminal, and its log -------------------------------------------------------


async def test_a_one_shot_command_on_a_terminal_prints_its_answer_alone(
    database_url: str, tmp_path: Path
) -> None:
    """`procurd ping` refused for a wrong secret prints one line on a terminal, exit 1; with --log-level the
    log line comes too, in the format asked for; on a pipe the log (JSON) is on stderr before the line."""
    async with Sandbox(SandboxConfig(products=2, allow_private_callbacks=True)) as sandbox:
        config = write_config(tmp_path, database_url, ("main", sandbox))
        env = environment(PROCURD_UPSTREAMS__MAIN__API_SECRET="not-the-secret")
        refusal = (
            "main: authentication failed: invalid_signature: check api_secret of main (it is shown once, "
            "when the key is created) and that base_url is the site root without /api/v1/upstream"
        )
        assert await one_line("--config", str(config), "ping", env=env) == (1, refusal)
        code, output, _ = await run_procurd(
            "--config", str(config), "ping", "--log-level", "warning", "--log-format", "json", env=env,
            terminal_columns=400,
        )  # fmt: skip
        lines = [line for line in screen_lines(output) if line]
        assert (code, lines[-1]) == (1, refusal)
        assert json.loads(lines[0])["event"] == "upstream.auth_refused"
        code, out, err = await run_procurd("--config", str(config), "ping", env=env)
        *log, last = err.splitlines()
        assert (code, out, last) == (1, "", refusal)
        assert [json.loads(line)["event"] for line in log] == ["upstream.auth_refused"]


async def test_an_unreachable_upstream_is_named_once(database_url: str, tmp_path: Path) -> None:
    """`ping`, `doctor` and `status` name an upstream that does not answer once, not twice."""
    config = write_config(tmp_path, database_url)
    code, line = await one_line("--config", str(config), "ping")
    assert code == 1
    assert line.startswith("main: network_error: cannot connect: "), line
    code, output, _ = await run_procurd(
        "--config", str(config), "doctor", env=environment(), terminal_columns=400
    )
    assert code == 1
    assert "✗ upstream main: no answer: network_error: cannot connect: " in output
    code, out, _ = await run_procurd("--config", str(config), "status", env=environment())
    assert code == 0
    [ping] = [line for line in out.splitlines() if line.startswith("  last ping")]
    assert re.fullmatch(r"  last ping +failed .* UTC\): network_error: cannot connect: .*", ping), ping
    assert "main ping" not in output + out


# --- words ------------------------------------------------------------------------------------------------


async def test_counts_agree_with_their_nouns(database_url: str, tmp_path: Path) -> None:
    """A pass of a catalogue that fits one page says "1 page" and "2 products"."""
    async with Sandbox(
        SandboxConfig(products=2, skus_per_product=1, allow_private_callbacks=True)
    ) as sandbox:
        config = write_config(tmp_path, database_url, ("main", sandbox))
        code, line = await one_line("--config", str(config), "catalog", "sync", "--no-progress")
    assert code == 0
    assert re.fullmatch(
        r"main: ok \(full\) in \d+\.\ds: 1 page, \d+ categor(y|ies), 2 products, 2 SKUs; \d+ added, "
        r"0 restored, 0 changed, 0 removed, \d+ rows written",
        line,
    ), line


async def test_order_submit_marks_what_it_requires() -> None:
    """`order submit --help` shows which options are required, and says what --trace-id and --body are."""
    code, out, _ = await run_procurd("order", "submit", "--help", env=environment())
    assert code == 0
    text = " ".join(out.split())
    assert " order submit (--order-no NO (--sku ID | --offer CODE) | --body FILE|-) [OPTIONS] " in text
    assert "--order-no NO The local (storefront) order number. [required unless --body]" in text
    assert "--trace-id ID A correlation id of yours" in text
    assert "--body FILE|- The whole request body as POSTed to /api/v1/orders" in text
    assert "--json Print JSON (what the admin API answers)." in text


async def test_status_tells_the_mirror_from_the_start_up_pass(database_url: str, tmp_path: Path) -> None:
    """After a daemon's start-up pass (incremental: nothing changed), `procurd status` shows what the mirror
    holds and, labelled as the pass's own, the nothing that pass listed."""
    async with Sandbox(
        SandboxConfig(products=3, skus_per_product=2, allow_private_callbacks=True)
    ) as sandbox:
        data = config_data(database_url, ("main", sandbox))
        settings = settings_of(data)
        await mirror(settings)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        try:

            async def incremental_done() -> bool:
                sync = (await daemon.operations.housekeeping.status())["upstreams"][0]["last_sync"]
                return bool(sync["kind"] == "incremental" and sync["status"] == "ok")

            await wait_until(incremental_done)
        finally:
            await daemon.shutdown()
        config = tmp_path / "procurd.toml"
        config.write_text(to_toml(data), encoding="utf-8")
        code, out, err = await run_procurd("--config", str(config), "status", env=environment())
    assert code == 0, err
    [held] = [line for line in out.splitlines() if line.startswith("  mirror")]
    assert re.fullmatch(r"  mirror +3 products, 6 SKUs, \d+ categor(y|ies)", held), held
    [sync] = [line for line in out.splitlines() if line.startswith("  last sync")]
    assert re.fullmatch(
        r"  last sync +ok \(incremental pass\) .* UTC\): this pass listed 0 products and 0 SKUs \(only those "
        r"changed since the pass before\)",
        sync,
    ), sync


# --- the sandbox ------------------------------------------------------------------------------------------


async def test_the_sandbox_logs_at_the_level_and_in_the_format_asked_for() -> None:
    """`procurd sandbox --log-level critical` is accepted and logs nothing; `--log-format json` logs JSON
    lines at the level asked for (info: the listening line)."""
    for level, expected in (("critical", []), ("info", ["sandbox.listening"])):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", "sandbox", "--port", "0", "--log-level", level, "--log-format",
            "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=environment(),
        )  # fmt: skip
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 30)
        assert first.startswith(b"procurd sandbox listening on http://127.0.0.1:")
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err
        assert [json.loads(line)["event"] for line in err.decode().splitlines()] == expected
