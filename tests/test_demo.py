"""``procurd demo`` runs the whole loop in one command and leaves a database to explore."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def procurd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "procurd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        cwd=cwd,
    )


def test_demo_delivers_an_order_of_each_protocol_and_leaves_a_database(tmp_path: Path) -> None:
    """The demo mirrors a Dujiao-Next site and an acg-faka shop, orders an auto and a manual product from the
    site and a card good from the shop, shows all three delivered with their upstream's protocol, and status
    works after; the commands it suggests to explore further run as printed."""
    result = procurd("demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "from sandbox (dujiao)" in out
    assert "from acg (acg-faka)" in out
    assert "DEMO-AUTO-1: delivered  (sandbox, dujiao)" in out
    assert "DEMO-MANUAL-1: delivered  (sandbox, dujiao)" in out
    assert "DEMO-ACG-1: delivered  (acg, acg-faka)" in out
    assert "ACCOUNT-ACTIVATION-CODE" in out
    assert "{'" not in out
    # The commands it suggests run as printed, from where the demo ran, with what started it.
    suggested = out.split("Explore them with:\n", 1)[1].splitlines()
    python = Path(sys.executable).name  # as printed when the PATH finds this very interpreter
    assert {line.split(" --config ")[0] for line in suggested} <= {
        f"  {python} -m procurd",
        f"  {sys.executable} -m procurd",
    }
    assert [line.split(".toml ")[1] for line in suggested] == [
        "status",
        "order show DEMO-AUTO-1",
        "order show DEMO-ACG-1",
        "exceptions list",
    ]
    shown = [
        subprocess.run(shlex.split(line), cwd=tmp_path, capture_output=True, text=True, timeout=60)
        for line in suggested
    ]
    assert [result.returncode for result in shown] == [0, 0, 0, 0], [result.stderr for result in shown]
    assert "order DEMO-AUTO-1: delivered" in shown[1].stdout
    assert "order DEMO-ACG-1: delivered" in shown[2].stdout
    assert "upstream        acg, SKU" in shown[2].stdout


def test_a_second_demo_in_the_same_directory_starts_fresh(tmp_path: Path) -> None:
    """Run again in the same directory, the demo takes in and delivers its own orders (202, not a repeat of
    the last run's), as quickly as the first time, and the database holds only this run's orders: the status
    shows both upstreams with their protocols, two orders delivered from the site and one from the shop."""
    directory = str(tmp_path / "demo")
    first = procurd("demo", "--dir", directory, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    between = datetime.now(UTC)
    started = time.monotonic()
    second = procurd("demo", "--dir", directory, cwd=tmp_path)
    seconds = time.monotonic() - started
    assert second.returncode == 0, second.stderr
    assert seconds < 45, f"the second demo took {seconds:.0f} s"
    for order_no in ("DEMO-AUTO-1", "DEMO-MANUAL-1", "DEMO-ACG-1"):
        assert f"{order_no}: accepted (HTTP 202)" in second.stdout
        assert f"{order_no}: delivered" in second.stdout
    config = str(tmp_path / "demo" / "procurd.toml")
    shown = procurd("--config", config, "order", "show", "DEMO-AUTO-1", "--json")
    assert shown.returncode == 0, shown.stderr
    created = datetime.fromisoformat(json.loads(shown.stdout)["order"]["created_at"].replace("Z", "+00:00"))
    assert created > between
    report = json.loads(procurd("--config", config, "status", "--json").stdout)
    upstreams = {upstream["name"]: upstream for upstream in report["upstreams"]}
    assert {name: upstream["protocol"] for name, upstream in upstreams.items()} == {
        "sandbox": "dujiao",
        "acg": "acg-faka",
    }
    assert upstreams["sandbox"]["queue"]["delivered"] == 2
    assert upstreams["acg"]["queue"]["delivered"] == 1
