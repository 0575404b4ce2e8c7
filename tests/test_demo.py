"""``procurd demo`` runs the whole loop in one command and leaves a database to explore."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_delivers_both_orders_and_leaves_a_database(tmp_path: Path) -> None:
    """The demo mirrors, orders an auto and a manual product, shows both delivered, and status works after."""
    result = subprocess.run(
        [sys.executable, "-m", "procurd", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "mirrored" in out
    assert "DEMO-AUTO-1: delivered" in out
    assert "DEMO-MANUAL-1: delivered" in out
    assert "ACCOUNT-ACTIVATION-CODE" in out
    config = tmp_path / "demo" / "procurd.toml"
    status = subprocess.run(
        [sys.executable, "-m", "procurd", "--config", str(config), "order", "show", "DEMO-AUTO-1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert "delivered" in status.stdout
