"""``procurd order``, ``procurd exceptions`` and ``procurd status`` against a database and the sandbox.

The commands run in a worker thread (each with its own event loop, as from a shell) while the sandbox and
procurd's public listener keep serving on this test's loop.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from console_support import INSTANCE_STATES, STOPPED_LONG_AGO, record_instances
from procurd.cli import main
from procurd.core.records import Instance
from procurd.db.types import utcnow
from procurd.http.testing import Stack, procurd_stack
from procurd.logs import configure_logging
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from support import run_procurd, screen_lines


@dataclass
class Shell:
    """A running procurd stack and a configuration file for the command line on the same database."""

    stack: Stack
    config: Path
    sku: int

    async def run(self, *args: str, stdin: str | None = None) -> Result:
        runner = CliRunner()
        try:
            result = await asyncio.to_thread(
                runner.invoke,
                main,
                ["--config", str(self.config), *args],
                input=stdin,
                env={"COLUMNS": "250"},
            )
        finally:
            # The command pointed logging at the runner's (now closed) stderr.
            configure_logging("warning", "json")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result


def write_config(path: Path, stack: Stack) -> Path:
    upstream = stack.settings.upstream("main")
    path.write_text(
        f"""
[database]
url = "{stack.settings.database.url}"

[server]
callback_url = "{stack.settings.server.callback_url}"
allow_private_callback_url = true

[logging]
level = "warning"
format = "json"

[[upstreams]]
name = "main"
base_url = "{upstream.base_url}"
api_key = "{upstream.api_key}"
api_secret = "{upstream.secret()}"
max_requests_per_second = 1000
timeout_seconds = 5
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture
async def shell(database_url: str, tmp_path: Path) -> AsyncIterator[Shell]:
    """One upstream mirrored, procurd's listeners up, and a procurd.toml for the command line."""
    async with procurd_stack(database_url, upstreams=("main",)) as stack:
        product = stack.sandbox.state.add_product(price="9.90")
        await stack.sync("main")
        sku = stack.sandbox.state.product(product).skus[0].id
        yield Shell(stack, write_config(tmp_path / "procurd.toml", stack), sku)


def parsed(result: Result) -> Any:
    return json.loads(result.stdout)


async def test_submit_repeat_and_conflict(shell: Shell) -> None:
    """submit accepts a new order (0), a repeat is fine (0), another body under the number is refused (1)."""
    first = await shell.run(
        "order", "submit", "--order-no", "C1", "--sku", str(shell.sku), "--trace-id", "t1"
    )
    assert first.exit_code == 0, first.stderr
    assert "accepted order C1" in first.stdout
    assert "queued" in first.stdout
    same = ("--order-no", "C1", "--sku", str(shell.sku), "--trace-id", "t1")
    again = await shell.run("order", "submit", *same, "--output", "json")
    assert again.exit_code == 0, again.stderr
    body = parsed(again)
    assert (body["ok"], body["created"], body["order"]["trace_id"]) == (True, False, "t1")
    conflict = await shell.run(
        "order", "submit", "--order-no", "C1", "--sku", str(shell.sku), "--quantity", "2"
    )
    assert conflict.exit_code == 1
    assert "order_conflict" in conflict.stderr


async def test_submit_previews_and_refuses_what_the_mirror_says_is_out_of_stock(shell: Shell) -> None:
    """``order submit --preview`` says what intake would do and takes nothing in (exit 0 when it would be
    accepted, 1 when refused, with why); an item out of stock is refused insufficient_stock (exit 1) unless
    ``--allow-backorder``, with a body from --body too."""
    state = shell.stack.sandbox.state
    state.set_sku_stock(shell.sku, 2)
    await shell.stack.sync("main")
    fine = await shell.run("order", "submit", "--preview", "--order-no", "B1", "--sku", str(shell.sku))
    assert fine.exit_code == 0, fine.stderr
    assert "order B1 would be accepted (202)" in fine.stdout
    assert f"item 0: main SKU {shell.sku} x1: bought" in fine.stdout
    assert "low_stock, 2" in fine.stdout
    short = ("--order-no", "B2", "--sku", str(shell.sku), "--quantity", "3")
    said = await shell.run("order", "submit", "--preview", *short)
    assert said.exit_code == 1
    assert "order B2 would be refused: 409 insufficient_stock: items.0: SKU" in said.stdout
    as_json = parsed(await shell.run("order", "submit", "--preview", *short, "--json"))
    assert as_json["preview"]["items"][0]["reason"] == "insufficient_stock"
    assert await shell.stack.operations.views.order("B1") is None
    assert await shell.stack.operations.views.order("B2") is None
    refused = await shell.run("order", "submit", *short)
    assert refused.exit_code == 1
    assert "procurd: insufficient_stock: items.0: SKU" in refused.stderr
    backorder = await shell.run("order", "submit", *short, "--allow-backorder", "--preview")
    assert backorder.exit_code == 0, backorder.stdout
    taken = await shell.run("order", "submit", *short, "--allow-backorder")
    assert taken.exit_code == 0, taken.stderr
    assert "accepted order B2" in taken.stdout
    body = json.dumps({"order_no": "B3", "items": [{"sku_id": shell.sku, "quantity": 5}]})
    from_body = await shell.run("order", "submit", "--body", "-", "--allow-backorder", stdin=body)
    assert from_body.exit_code == 0, from_body.stderr


async def test_submit_a_whole_body_from_stdin(shell: Shell) -> None:
    """``--body -`` reads the HTTP body from stdin and ``--json`` prints the answer, as on every command;
    amounts keep their exact text."""
    body = {"order_no": "B1", "items": [{"sku_id": shell.sku, "quantity": 2, "max_unit_price": "10.00"}]}
    result = await shell.run("order", "submit", "--body", "-", "--json", stdin=json.dumps(body))
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    [item] = parsed(result)["order"]["procurements"]
    assert (item["quantity"], item["max_unit_price"], item["unit_price"]) == (2, "10.00", "9.90")


async def test_submit_json_file_is_the_old_spelling_of_body(shell: Shell, tmp_path: Path) -> None:
    """``--json FILE`` (this command's request body before ``--body``) still submits the file, with one line
    saying it is deprecated; ``--json`` alone prints JSON; both spellings of the body at once exit 2."""
    body = tmp_path / "body.json"
    body.write_text(
        json.dumps({"order_no": "J1", "items": [{"sku_id": shell.sku, "quantity": 1}]}), encoding="utf-8"
    )
    old = await shell.run("order", "submit", "--json", str(body), "--output", "json")
    assert old.exit_code == 0, old.stderr
    assert old.stderr.splitlines() == ["procurd: order submit --json FILE is deprecated: use --body FILE"]
    assert parsed(old)["order"]["order_no"] == "J1"
    plain = await shell.run("order", "submit", "--order-no", "J2", "--sku", str(shell.sku), "--json")
    assert (plain.exit_code, parsed(plain)["created"]) == (0, True)
    both = await shell.run("order", "submit", "--json", str(body), "--body", str(body))
    assert both.exit_code == 2
    assert (
        both.stderr.splitlines()[-1] == "procurd: give --body FILE|- once (--json FILE is its old spelling)"
    )


@pytest.mark.parametrize(
    ("args", "stdin", "code", "reason"),
    [
        (["--order-no", "U1", "--sku", "999999"], None, 1, "sku_not_found"),
        (["--order-no", "U1", "--sku", "{sku}", "--upstream", "nope"], None, 1, "unknown_upstream"),
        (["--order-no", "U1", "--sku", "{sku}", "--max-unit-price", "cheap"], None, 1, "invalid_request"),
        (["--body", "-"], "{not json", 1, "invalid_json"),
        (["--body", "-"], "[1]", 1, "invalid_request"),
        (["--order-no", "U1", "--sku", "{sku}", "--form-data", "{bad"], None, 2, "--form-data"),
        (["--order-no", "U1", "--sku", "{sku}", "--form-data", "[1]"], None, 2, "--form-data"),
        (["--order-no", "U1"], None, 2, "--sku"),
        (["--order-no", "U1", "--sku", "{sku}", "--quantity", "0"], None, 2, "--quantity"),
        (["--order-no", "U1", "--body", "-"], "{}", 2, "either --body"),
    ],
)
async def test_submit_refusals_exit_1_and_usage_errors_exit_2(
    shell: Shell, args: list[str], stdin: str | None, code: int, reason: str
) -> None:
    """A refused order exits 1 with the reason on stderr; a bad command line exits 2; nothing is stored."""
    result = await shell.run(
        "order", "submit", *(arg.replace("{sku}", str(shell.sku)) for arg in args), stdin=stdin
    )
    assert result.exit_code == code
    assert reason in result.stderr
    assert await shell.stack.operations.views.order("U1") is None


async def test_show_hides_delivered_goods_unless_asked(shell: Shell) -> None:
    """order show prints the order, its procurements and audit trail; the payload only with --show-payload."""
    assert (await shell.run("order", "submit", "--order-no", "S1", "--sku", str(shell.sku))).exit_code == 0
    assert await shell.stack.submit_due()
    await shell.stack.sandbox.wait_callbacks_idle()
    payload = (await shell.stack.order("S1"))["procurements"][0]["fulfillment"]["payload"]

    table = await shell.run("order", "show", "S1")
    assert table.exit_code == 0, table.stderr
    assert "order S1: delivered" in table.stdout
    assert "audit trail" in table.stdout
    assert "callback" in table.stdout
    assert payload not in table.stdout
    shown = await shell.run("order", "show", "S1", "--show-payload")
    assert payload in shown.stdout

    hidden_json = parsed(await shell.run("order", "show", "S1", "--json"))
    fulfillment = hidden_json["order"]["procurements"][0]["fulfillment"]
    assert (fulfillment["payload"], fulfillment["delivery_data"], fulfillment["payload_hidden"]) == (
        None,
        None,
        True,
    )
    assert [entry["event"] for entry in hidden_json["audit"]] == [
        "accepted",
        "claimed",
        "submitted",
        "delivered",
    ]
    full_json = parsed(await shell.run("order", "show", "S1", "--json", "--show-payload"))
    assert full_json["order"]["procurements"][0]["fulfillment"]["payload"] == payload

    missing = await shell.run("order", "show", "NOPE", "--json")
    assert missing.exit_code == 1
    assert "order_not_found" in missing.stderr
    assert parsed(missing)["error_code"] == "order_not_found"


async def test_cancel_local_and_denied(shell: Shell) -> None:
    """cancel of a never-sent order succeeds (0); of a paid one the upstream refuses (1, nothing changes)."""
    assert (await shell.run("order", "submit", "--order-no", "K1", "--sku", str(shell.sku))).exit_code == 0
    canceled = await shell.run("order", "cancel", "K1")
    assert canceled.exit_code == 0, canceled.stderr
    assert "canceled order K1" in canceled.stdout

    shell.stack.sandbox.faults.hold_delivery_next()
    assert (await shell.run("order", "submit", "--order-no", "K2", "--sku", str(shell.sku))).exit_code == 0
    assert await shell.stack.submit_due()
    before = await shell.stack.order("K2")
    denied = await shell.run("order", "cancel", "K2", "--json")
    assert denied.exit_code == 1
    assert "cancel_not_allowed" in denied.stderr
    answer = parsed(denied)
    assert answer["error_code"] == "cancel_not_allowed"
    assert answer["items"][0]["downstream_order_no"] == "K2"
    assert await shell.stack.order("K2") == before
    assert (await shell.run("order", "cancel", "NOPE")).exit_code == 1


async def test_exception_queue_list_retry_resolve(shell: Shell) -> None:
    """exceptions list pages and filters (a filter naming no upstream or reason is refused with exit 2 and the
    known values); retry queues again; resolve needs a note; refusals exit 1."""
    for number in ("E1", "E2"):
        submitted = await shell.run("order", "submit", "--order-no", number, "--sku", str(shell.sku),
                                    "--max-unit-price", "0.01")  # fmt: skip
        assert submitted.exit_code == 0, submitted.stderr
    listing = parsed(await shell.run("exceptions", "list", "--json"))
    assert (listing["total"], [item["order_no"] for item in listing["items"]]) == (2, ["E1", "E2"])
    page = parsed(await shell.run("exceptions", "list", "--reason", "price_above_limit", "--page", "2",
                                  "--page-size", "1", "--json"))  # fmt: skip
    assert [item["order_no"] for item in page["items"]] == ["E2"]
    assert parsed(await shell.run("exceptions", "list", "--upstream", "main", "--json"))["total"] == 2
    typo = await shell.run("exceptions", "list", "--upstream", "other")
    assert (typo.exit_code, "unknown_upstream" in typo.stderr, "configured: main" in typo.stderr) == (
        2,
        True,
        True,
    )
    reason_typo = await shell.run("exceptions", "list", "--reason", "max_attempt_exceeded")
    assert reason_typo.exit_code == 2
    assert "max_attempts_exceeded" in reason_typo.stderr  # the known values are named
    table = await shell.run("exceptions", "list")
    assert "E1" in table.stdout
    assert "2 open exceptions" in table.stdout
    first, second = (item["id"] for item in listing["items"])

    retried = await shell.run("exceptions", "retry", str(first), "--note", "limit raised", "--json")
    assert retried.exit_code == 0, retried.stderr
    assert parsed(retried)["procurement"]["state"] == "queued"
    again = await shell.run("exceptions", "retry", str(first))
    assert again.exit_code == 1
    assert "not_an_exception" in again.stderr

    unnoted = await shell.run("exceptions", "retry", str(second), "--nothing-bought")
    assert unnoted.exit_code == 2
    assert "--nothing-bought needs --note" in unnoted.stderr

    blank = await shell.run("exceptions", "resolve", str(second), "--note", "  ")
    assert blank.exit_code == 2
    no_note = await shell.run("exceptions", "resolve", str(second))
    assert no_note.exit_code == 2
    resolved = await shell.run("exceptions", "resolve", str(second), "--note", "settled by hand")
    assert resolved.exit_code == 0, resolved.stderr
    assert f"procurement {second} resolved" in resolved.stdout
    assert (await shell.stack.order("E2"))["procurements"][0]["resolution_note"] == "settled by hand"
    unknown = await shell.run("exceptions", "resolve", "99999", "--note", "x")
    assert unknown.exit_code == 1
    assert "procurement_not_found" in unknown.stderr


async def test_exceptions_retry_all(shell: Shell) -> None:
    """retry-all needs a filter, queues the matching exceptions oldest first up to --limit, then the rest."""
    for number in ("B1", "B2", "B3"):
        submitted = await shell.run("order", "submit", "--order-no", number, "--sku", str(shell.sku),
                                    "--max-unit-price", "0.01")  # fmt: skip
        assert submitted.exit_code == 0, submitted.stderr
    ids = [item["id"] for item in parsed(await shell.run("exceptions", "list", "--json"))["items"]]

    unfiltered = await shell.run("exceptions", "retry-all")
    assert unfiltered.exit_code == 2
    assert "--reason or --upstream, or pass --all" in unfiltered.stderr
    unknown = await shell.run("exceptions", "retry-all", "--upstream", "other")
    assert unknown.exit_code == 2
    assert "no upstream 'other'" in unknown.stderr
    assert parsed(await shell.run("exceptions", "list", "--json"))["total"] == 3

    first = await shell.run("exceptions", "retry-all", "--reason", "price_above_limit", "--limit", "2",
                            "--note", "limit raised")  # fmt: skip
    assert first.exit_code == 0, first.stderr
    assert "2 exceptions queued again" in first.stdout
    assert "1 more match" in first.stdout
    rest = parsed(await shell.run("exceptions", "retry-all", "--all", "--json"))
    assert (rest["retried"], rest["skipped"], rest["remaining"]) == ([ids[2]], [], 0)
    none_left = parsed(await shell.run("exceptions", "retry-all", "--upstream", "main", "--json"))
    assert (none_left["retried"], none_left["remaining"]) == ([], 0)
    for number in ("B1", "B2", "B3"):
        assert (await shell.stack.order(number))["procurements"][0]["state"] == "queued"
    trail = await shell.stack.operations.views.audit("B1")
    assert trail[-1]["event"] == "retry"
    assert trail[-1]["detail"]["note"] == "limit raised"


async def test_status_for_people_and_machines(shell: Shell) -> None:
    """status prints a table per upstream, or the status report as JSON."""
    assert (await shell.run("order", "submit", "--order-no", "Q1", "--sku", str(shell.sku))).exit_code == 0
    report = await shell.run("status", "--json")
    assert report.exit_code == 0, report.stderr
    data = parsed(report)
    assert data["ok"] is True
    [upstream] = data["upstreams"]
    assert (upstream["name"], upstream["queue"]["queued"], upstream["last_sync"]["ok"]) == ("main", 1, True)
    table = await shell.run("status")
    assert table.exit_code == 0, table.stderr
    assert "main" in table.stdout
    assert "never" in table.stdout  # never pinged
    assert "no events pending" in table.stdout


async def test_status_says_in_words_when_no_daemon_runs(shell: Shell) -> None:
    """With no daemon on the database, status says first that nothing is being procured (whatever the
    upstreams' health) and the JSON report has daemon_alive false; an instance that stopped cleanly is
    named with its last heartbeat."""
    queued = await shell.run("order", "submit", "--order-no", "N1", "--sku", str(shell.sku))
    assert queued.exit_code == 0
    never = await shell.run("status")
    assert never.stdout.splitlines()[1].startswith(
        "daemon: NOT RUNNING: no procurd daemon is alive (none has ever run on this database)"
    )
    assert "not procured until `procurd run`" in " ".join(never.stdout.split())
    now = utcnow()
    old = Instance(id="old:1", host="old", pid=1, version="0.1.0", started_at=now, heartbeat_at=now)
    database = shell.stack.runtime.database
    await database.write(lambda tx: tx.instances.register(old))
    await database.write(lambda tx: tx.instances.stopped("old:1", now))
    stopped = await shell.run("status", "--json")
    data = parsed(stopped)
    assert data["daemon_alive"] is False
    assert [(i["id"], i["alive"]) for i in data["instances"]] == [("old:1", False)]
    words = await shell.run("status")
    assert "the last heartbeat was" in words.stdout.splitlines()[1]


async def test_status_tells_alive_stopped_and_down_apart_as_the_console_does(shell: Shell) -> None:
    """``procurd status`` names each instance in the state the status report and the console give it: the
    one alive as running, those down as down (found down, or no heartbeat and no clean shutdown), those
    stopped cleanly within a day by name and the older ones as a count."""
    await record_instances(shell.stack.runtime.database)
    report = parsed(await shell.run("status", "--json"))
    assert {i["id"]: i["state"] for i in report["instances"]} == INSTANCE_STATES
    words = " ".join((await shell.run("status")).stdout.split())
    assert "daemon: running: alive:1 (procurd 1.0.0" in words
    assert "instance down:3 went down without a clean shutdown" in words
    assert "instance stale:4 is down: no heartbeat since" in words
    assert "stopped cleanly: stopped:2 2 h ago, 3 instances more than a day ago" in words
    assert all(name not in words for name in STOPPED_LONG_AGO)


async def test_unmigrated_database_and_bad_configuration(shell: Shell, tmp_path: Path) -> None:
    """An empty database exits 1 asking for ``db upgrade``; a broken configuration exits 2."""
    empty = tmp_path / "empty.toml"
    empty.write_text(
        shell.config.read_text(encoding="utf-8").replace(
            shell.stack.settings.database.url, f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
        ),
        encoding="utf-8",
    )
    runner = CliRunner()
    try:
        unmigrated = await asyncio.to_thread(runner.invoke, main, ["--config", str(empty), "status"])
        broken = await asyncio.to_thread(
            runner.invoke, main, ["--config", str(tmp_path / "none.toml"), "status"]
        )
    finally:
        configure_logging("warning", "json")
    assert unmigrated.exit_code == 1
    assert "procurd db upgrade" in unmigrated.stderr
    assert broken.exit_code == 2


async def exceptions_and_a_delivery(shell: Shell) -> None:
    """Orders E1 and E2 refused for their price (exceptions), D1 delivered."""
    for number in ("E1", "E2"):
        submitted = await shell.run("order", "submit", "--order-no", number, "--sku", str(shell.sku),
                                    "--max-unit-price", "0.01")  # fmt: skip
        assert submitted.exit_code == 0, submitted.stderr
    assert (await shell.run("order", "submit", "--order-no", "D1", "--sku", str(shell.sku))).exit_code == 0
    assert await shell.stack.submit_due()
    await shell.stack.sandbox.wait_callbacks_idle()
    assert (await shell.stack.order("D1"))["status"] == "delivered"


@pytest.mark.parametrize("terminal_columns", [None, 80], ids=["pipe", "80-column terminal"])
async def test_human_output_reads_well(shell: Shell, terminal_columns: int | None) -> None:
    """status, exceptions list and order show, on a pipe and on an 80-column terminal: no line wider than
    the terminal, no word cut, no Python structures, times in UTC with their age, counted nouns."""
    await exceptions_and_a_delivery(shell)
    config = ("--config", str(shell.config))

    async def show(*args: str) -> list[str]:
        code, out, err = await run_procurd(*config, *args, terminal_columns=terminal_columns)
        assert code == 0, out + err
        assert err == ""
        lines = (screen_lines(out) if terminal_columns else out.splitlines()) or [""]
        while len(lines) > 1 and not lines[-1]:
            lines.pop()
        for line in lines:
            assert "{'" not in line, line
            assert "(s)" not in line, line
            if terminal_columns:
                assert len(line) <= terminal_columns, line
        return lines

    status = "\n".join(await show("status"))
    assert "upstream main: healthy" in status or "upstream main: NOT HEALTHY" in status
    assert "procurements  delivered 1, exception 2\n" in status
    words = " ".join(status.split())  # as read, whatever the terminal wrapped
    assert "exceptions 2 open exceptions (price_above_limit 2): see `procurd exceptions list`" in words
    assert re.search(r"mirror \d+ products, \d+ SKUs, \d+ categor(y|ies) last sync ok \(full pass\) ", words)
    assert re.search(r"this pass listed \d+ products? and \d+ SKUs?", words)  # told from the mirror's
    assert " ago (20" in words or "just now (20" in words
    assert " UTC)" in words

    listing = await show("exceptions", "list")
    header = next(line for line in listing if "reason" in line)
    assert header.split() == ["id", "order", "number", "upstream", "reason", "since", "tries"]
    rows = [line.split() for line in listing if line.startswith("  ") and line.split()[0].isdigit()]
    assert [row[1] for row in rows] == ["E1", "E2"]
    assert any("is above max_unit_price" in line for line in listing)
    assert listing[-1] == "2 open exceptions; page 1 of 1"
    single = await show("exceptions", "list", "--page-size", "1", "--page", "2")
    assert single[-1] == "2 open exceptions; page 2 of 2"
    empty = await show("exceptions", "list", "--reason", "payment_failed")
    assert empty == ["no open exceptions for reason payment_failed"]

    order = "\n".join(await show("order", "show", "D1"))
    assert "order D1: delivered" in order
    assert "1 line\n" in order
    assert "payload         hidden (--show-payload shows it)" in order
    assert "audit trail" in order
    assert "time (UTC)" in order


async def test_one_shot_commands_print_no_info_lines(shell: Shell) -> None:
    """With [logging] level = "info" in the file, status prints its report and no log line; --log-level
    brings them back."""
    text = shell.config.read_text(encoding="utf-8").replace('level = "warning"', 'level = "info"')
    shell.config.write_text(text, encoding="utf-8")
    code, out, err = await run_procurd("--config", str(shell.config), "status")
    assert code == 0, err
    assert out.startswith("procurd status at")
    assert err == ""


async def test_output_json_is_a_synonym_of_json(shell: Shell) -> None:
    """``--output json`` prints exactly what ``--json`` prints (the docs' and the scripts' spelling)."""
    await exceptions_and_a_delivery(shell)
    for args in (["exceptions", "list"], ["order", "show", "D1"]):
        as_json = parsed(await shell.run(*args, "--json"))
        as_output = parsed(await shell.run(*args, "--output", "json"))
        assert as_output == as_json
    assert parsed(await shell.run("status", "--output", "json"))["ok"] is True


async def test_show_counts_identical_late_reports_on_one_line(shell: Shell) -> None:
    """An upstream repeating a late status after the delivery is one line of order show's audit trail, with
    how many times it came."""
    assert (await shell.run("order", "submit", "--order-no", "L1", "--sku", str(shell.sku))).exit_code == 0
    assert await shell.stack.submit_due()
    await shell.stack.sandbox.wait_callbacks_idle()
    order_id = (await shell.stack.order("L1"))["procurements"][0]["upstream_order_id"]
    late = json.dumps({"order_id": order_id, "downstream_order_no": "L1", "status": "paid"}).encode()
    async with shell.stack.signer() as signer:
        for _ in range(3):
            answer = await signer.request("POST", CALLBACK_PATH, body=late)
            assert answer.status == 200
    table = await shell.run("order", "show", "L1")
    assert table.exit_code == 0, table.stderr
    assert table.stdout.count("late_status_ignored") == 1
    assert "late_status_ignored x3" in table.stdout
