"""Retry and poll schedules (pure)."""

from __future__ import annotations

import random


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before submission attempt ``attempt + 1``, after ``attempt`` failed ones.

    Exponential (``base``, ``2·base``, ``4·base`` ...) capped at ``cap``, with "equal jitter": the delay is
    drawn from the upper half of the step, so retries of many procurements spread out but never come
    sooner than half the nominal step.
    """
    step = min(cap, base * (2 ** max(0, attempt - 1)))
    source = rng if rng is not None else random.Random()
    return float(step / 2 + source.uniform(0, step / 2))


def next_poll_interval(previous: float | None, initial: float, cap: float) -> float:
    """The interval before the next fallback poll: ``initial`` first, then doubling up to ``cap``."""
    if previous is None:
        return initial
    return min(cap, previous * 2)
