"""Daemon instances as a person sees them (pure): three states, and the old clean stops folded away."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

INSTANCE_STATES = ("alive", "stopped", "down")
"""Where a daemon instance stands: ``alive`` (beating within three heartbeats), ``stopped`` (a clean
shutdown), ``down`` (gone without one: found dead by another instance, or its heartbeat too old)."""

STOPPED_SHOWN = timedelta(days=1)
"""Instances stopped cleanly longer ago than this are folded away (counted, listed on demand)."""


def fold_stopped(
    instances: Sequence[Mapping[str, Any]], now: datetime
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The status report's instances in two: those to show (alive, down, and stopped within the last day)
    and those stopped cleanly more than a day ago, which ``procurd status`` counts and the console folds."""
    cutoff = now - STOPPED_SHOWN
    shown: list[Mapping[str, Any]] = []
    folded: list[Mapping[str, Any]] = []
    for instance in instances:
        stopped = _moment(instance.get("stopped_at"))
        old = instance.get("state") == "stopped" and stopped is not None and stopped < cutoff
        (folded if old else shown).append(instance)
    return shown, folded


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
