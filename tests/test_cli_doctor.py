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
    check_provider,
    check_upstreams,
)
from procurd.config import Settings
from procurd.core.offering import OfferFacts, why_nothing_is_offered
from procurd.loopback import unused_ports
from procurd.sandbox import Sandbox, SandboxConfig
from provider_support import provider_config
from support import mirror, run_procurd
from test_alerts import receiving
from test_cli_provider import to_toml

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
    assert [
        check_configuration, check_database_ready, check_upstreams, check_provider, check_alert_urls
    ] == DOCTOR_CHECKS  # fmt: skip


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


def test_why_a_provider_offers_nothing_names_the_cause() -> None:
    """A provider that can offer no SKU has one of three causes, each named with what to do: nothing
    mirrored, no pricing rule, rules in another currency (or rules that price nothing)."""

    def facts(selling: dict[str | None, int], rules: int = 1) -> OfferFacts:
        return OfferFacts("CNY", ("main",), selling, rules)

    assert why_nothing_is_offered(facts({"CNY": 3, None: 2})) is None
    assert str(why_nothing_is_offered(facts({}))).startswith(
        "no mirrored SKUs of the offered upstreams (main)"
    )
    unpriced = why_nothing_is_offered(facts({None: 5}, rules=0))
    assert unpriced is not None
    assert unpriced.cause.startswith("no pricing rule: a SKU is offered only with a selling price in CNY")
    assert "add a [[pricing.rules]] block" in unpriced.fix
    foreign = why_nothing_is_offered(facts({"USD": 4, None: 1}))
    assert foreign is not None
    assert foreign.cause == (
        "the pricing rules price the mirrored SKUs in another currency than [provider] currency CNY "
        "(4 in USD)"
    )
    assert 'set currency = "CNY"' in foreign.fix
    nothing = why_nothing_is_offered(facts({None: 5}))
    assert nothing is not None
    assert nothing.cause.startswith("no pricing rule prices the 5 mirrored SKUs")


def provider_file(tmp_path: Path, database_url: str, sandbox: Sandbox, **sections: object) -> Path:
    data = provider_config(database_url, ("main", sandbox), **sections)  # type: ignore[arg-type]
    path = tmp_path / "procurd.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    return path


async def test_doctor_and_status_check_the_provider(tmp_path: Path, database_url: str) -> None:
    """With [provider] enabled: no pricing rule fails "provider products" naming the cause, and status warns
    that nothing is offered; rules in another currency fail naming it; rules in CNY pass, and no account
    yet or an account below the low-balance threshold are warnings (exit 0)."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        bare = provider_file(tmp_path, database_url, sandbox, pricing={"rules": []},
                             provider={"low_balance_threshold": "100.00"})  # fmt: skip
        await mirror(Settings(**provider_config(database_url, ("main", sandbox), pricing={"rules": []})))
        code, lines, _ = await doctor(bare)
        assert code == 1, lines
        products = lines.index(next(line for line in lines if line.startswith("✗ provider products:")))
        assert lines[products].startswith(
            "✗ provider products: none to offer: no pricing rule: a SKU is offered"
        )
        assert lines[products + 1].startswith("    → add a [[pricing.rules]] block")
        assert "⚠ provider accounts: none yet: no downstream site can buy" in lines
        status_code, status, _ = await run_procurd(
            "--config", str(bare), "status", env=without_procurd_variables()
        )
        assert status_code == 0
        assert "WARNING: nothing is offered: no pricing rule" in " ".join(status.split())

        foreign = provider_file(tmp_path, database_url, sandbox, pricing={"rules": [{"currency": "USD"}]},
                                provider={"low_balance_threshold": "100.00"})  # fmt: skip
        assert (await run_procurd("--config", str(foreign), "catalog", "reprice"))[0] == 0
        code, lines, _ = await doctor(foreign)
        assert code == 1, lines
        foreign_cause = (
            "✗ provider products: none to offer: the pricing rules price the mirrored SKUs in another "
            "currency than [provider] currency CNY"
        )
        assert any(line.startswith(foreign_cause) for line in lines), lines
        assert "✗ provider pricing currency: no pricing rule sells in CNY: #1 for main in USD" in lines

        priced = provider_file(tmp_path, database_url, sandbox, provider={"low_balance_threshold": "100.00"})
        assert (await run_procurd("--config", str(priced), "catalog", "reprice"))[0] == 0
        for command in (("account", "add", "shop-c"), ("topup", "shop-c", "5.00", "--note", "first")):
            assert (await run_procurd("--config", str(priced), "provider", *command))[0] == 0
        code, lines, _ = await doctor(priced)
    assert code == 0, lines
    assert any(
        line.startswith("✔ provider products: ") and "priced in CNY to offer" in line for line in lines
    )
    assert "✔ provider pricing currency: the pricing rules sell in CNY" in lines
    assert "✔ provider accounts: 1 account" in lines
    assert "⚠ provider balances: below 100.00 CNY: shop-c 5.00 CNY" in lines
    assert lines[-1].endswith("checks passed (1 warning)")
