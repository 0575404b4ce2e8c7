"""Group commit: commands that arrive while one transaction commits go into the next one together.

Every caller still waits for its own command's commit, so an answer such as "received" is only given once
the change is durable; but a busy process commits tens of commands per transaction instead of one each.
A command that fails on its own (its run function returns the exception for it) does not hold back the
others; a transaction that fails as a whole on a uniqueness conflict is run again one command at a time, so
only the command that caused it sees the error.

A result the run function can build from what the transaction decided, without the database, it returns as
:class:`Later`: built after the commit, on the caller's side, so that the transaction (which every change of
the process waits for, and on SQLite the write lock) ends sooner.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import structlog

from procurd.db.errors import Conflict, DatabaseError

if TYPE_CHECKING:
    from procurd.db.database import Database
    from procurd.db.stores import Tx

C = TypeVar("C")
R = TypeVar("R")

log = structlog.get_logger("procurd.db")


@dataclass(frozen=True, slots=True)
class Later(Generic[R]):
    """A command's result built after its transaction committed (``build`` reads no database)."""

    build: Callable[[], R]


BatchFunction = Callable[["Tx", Sequence[C]], list["R | Later[R] | Exception"]]
"""Runs commands in one transaction: one result (or its :class:`Later`), or the exception that command alone
raised, per command."""


@dataclass(slots=True)
class _Pending(Generic[C, R]):
    command: C
    future: asyncio.Future[R] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class BatchWriter(Generic[C, R]):
    """Runs submitted commands through ``run`` in as few transactions as the load allows.

    ``max_batch`` bounds one transaction. The writer task starts with the first command and stops with
    :meth:`close`, after the commands already submitted are committed.
    """

    def __init__(self, database: Database, run: BatchFunction[C, R], *, max_batch: int = 128) -> None:
        self._database = database
        self._run = run
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending[C, R] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.transactions = 0
        self.commands = 0

    async def submit(self, command: C) -> R:
        """Run ``command`` and return its result once it is committed (or raise its error)."""
        if self._closed:
            raise RuntimeError("the writer is closed")
        pending: _Pending[C, R] = _Pending(command)
        self._queue.put_nowait(pending)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._work(), name="procurd database writer")
        return await pending.future

    async def close(self) -> None:
        """Commit what was submitted, then stop."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _work(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch and not self._queue.empty():
                following = self._queue.get_nowait()
                if following is None:
                    await self._commit(batch)
                    return
                batch.append(following)
            await self._commit(batch)

    async def _commit(self, batch: list[_Pending[C, R]]) -> None:
        try:
            results = await self._database.write(self._run, [pending.command for pending in batch])
        except Conflict as conflict:
            if len(batch) == 1:
                _settle(batch[0], None, conflict)
                return
            # Somebody else wrote one of these keys first: find out which command it concerns.
            for pending in batch:
                await self._commit([pending])
            return
        except Exception as exc:
            if not isinstance(exc, DatabaseError):
                log.exception("db.batch_failed", commands=len(batch))
            for pending in batch:
                _settle(pending, None, exc)
            return
        self.transactions += 1
        self.commands += len(batch)
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, Later):
                try:
                    result = result.build()
                except Exception as exc:
                    log.exception("db.result_failed")
                    result = exc
            if isinstance(result, Exception):
                _settle(pending, None, result)
            else:
                _settle(pending, result, None)


def _settle(pending: _Pending[C, R], result: R | None, error: BaseException | None) -> None:
    if pending.future.done():  # the caller gave up waiting; the command ran anyway
        return
    if error is not None:
        pending.future.set_exception(error)
    else:
        pending.future.set_result(result)  # type: ignore[arg-type]
