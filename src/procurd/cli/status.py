"""``procurd status``: the status report (what ``GET /api/v1/status`` answers), for a person."""

from __future__ import annotations

from procurd.cli.base import CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.operations import open_operations
from procurd.output import print_status


@main.command("status")
@json_option
@common_options
@pass_state
def status(state: CliState, as_json: bool) -> None:
    """Per upstream: health, last ping and balance, last catalogue sync, queue depths, exceptions."""
    run_command(_status(state.settings(), as_json), as_json)


async def _status(settings: Settings, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        report = await operations.housekeeping.status()
    if as_json:
        emit_json(report)
        return
    print_status(report)
