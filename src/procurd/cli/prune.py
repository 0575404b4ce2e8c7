"""``procurd prune``: apply ``[retention]`` now (the daemon does it once a day)."""

from __future__ import annotations

from procurd.cli.base import CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.operations.housekeeping import TABLES
from procurd.output import Column, echo, print_table


@main.command("prune")
@json_option
@common_options
@pass_state
def prune_command(state: CliState, as_json: bool) -> None:
    """Delete audit entries, mirror changes, delivered storefront events, sync runs and alerts older than
    [retention] keeps them (0 days: kept forever), in small batches that leave the daemon room to work."""
    run_command(_prune(state.settings(), as_json), as_json)


async def _prune(settings: Settings, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        report = await operations.housekeeping.prune()
    if as_json:
        emit_json({"ok": True, "deleted": report.deleted, "total": report.total})
        return
    rows = [
        [name, report.deleted.get(name, 0), f"before {before:%Y-%m-%d %H:%M} UTC"]
        for name, before in report.cutoffs.items()
    ]
    print_table([Column("table"), Column("deleted", right=True), Column("rows written")], rows)
    forever = [name for name in TABLES if name not in report.cutoffs]
    if forever:
        echo("kept forever: " + ", ".join(forever))
    echo(f"{count(report.total, 'row')} deleted")
