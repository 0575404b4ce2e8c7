"""Small asyncio helpers shared by the long-running tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for_any(*events: asyncio.Event | None, timeout: float) -> None:
    """Return when any of ``events`` is set or ``timeout`` seconds have passed."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events if event is not None]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def undone_if_cancelled(step: Awaitable[T], undo: Callable[[T], Awaitable[object]]) -> T:
    """The result of ``step``, a write that runs to its end even when its caller is cancelled (see
    ``Database.write``). When the caller is cancelled meanwhile, the write's result is waited for all the
    same and handed to ``undo`` (give a lease back, close a run), then the cancellation goes on."""
    running = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await undo(await running)
        raise
