"""``procurd demo``: the whole loop on SQLite and two sandbox upstreams (Dujiao-Next and acg-faka)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from procurd.cli.base import fail_usage, main, run_async
from procurd.operations import file_location_problem


@main.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("procurd-demo"),
    show_default=True,
    help="Where the demo's database and configuration are written (and kept).",
)
def demo(directory: Path) -> None:
    """Mirror two sandbox upstreams, a Dujiao-Next site and an acg-faka shop, order an automatic and a
    manual product from the site and a card good from the shop, follow them to delivery.

    Each run starts from a fresh database in the directory.
    """
    from rich.console import Console

    from procurd.demo import DATABASE_NAME, run_demo

    problem = file_location_problem(directory / DATABASE_NAME)
    if problem is not None:
        fail_usage(f"--dir {directory}: {problem}")

    sys.exit(run_async(run_demo(directory, Console())))
