"""A start that fails leaves no ghost: ``procurd run`` that cannot serve says why in one line, records no
instance (``procurd status`` does not call it running, nobody later finds it "down"), takes nothing over
from the instances that run, and a service that keeps failing is one alert whose count is its tries."""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from procurd import __version__
from procurd.core.records import Instance
from procurd.daemon import Daemon
from procurd.db.schema import alerts, audit_log, instances, leases
from procurd.db.types import utcnow
from procurd.operations.instances import Heartbeat
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.systemd import Notifier
from scale_cluster import settings_of, to_toml
from support import config_data, run_procurd, screen_lines, settings_for, sql_rows, wait_until


def environment() -> dict[str, str]:
    """The test run's environment without PROCURD_ variables (the file alone configures the commands)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("PROCURD_")}


def write_config(directory: Path, data: dict[str, Any]) -> Path:
    path = directory / "procurd.toml"
    path.write_text(to_toml(data), encoding="utf-8")
    return path


@contextmanager
def port_taken(port: int) -> Iterator[None]:
    """Another program listening on 127.0.0.1:``port``."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    try:
        yield
    finally:
        listener.close()


def refusal(which: str, port: int) -> str:
    return (
        f"procurd: not starting: cannot listen on 127.0.0.1:{port} ([server] {which}_host and {which}_port): "
        "address already in use (another procurd, or another program, listens there)"
    )


async def test_three_failed_starts_leave_no_instance_and_one_counted_alert(
    database_url: str, tmp_path: Path
) -> None:
    """With the admin port taken, `procurd run` exits 1 with one line on a terminal (the same line last on a
    pipe, after its log); afterwards `procurd status` says no daemon runs and that the starts failed,
    `instances` is empty, and the three tries are one `daemon_failed` alert counted 3, no `instance_down`."""
    data = config_data(database_url)
    data["upstreams"] = [
        {"name": "main", "base_url": "http://127.0.0.1:9", "api_key": "k", "api_secret": "s"}
    ]
    config = write_config(tmp_path, data)
    admin_port = data["server"]["admin_port"]
    with port_taken(admin_port):
        code, output, _ = await run_procurd(
            "--config", str(config), "run", env=environment(), terminal_columns=400
        )
        assert code == 1
        assert [line for line in screen_lines(output) if line] == [refusal("admin", admin_port)]
        for _ in range(2):
            code, out, err = await run_procurd("--config", str(config), "run", env=environment())
            assert (code, out) == (1, "")
            *log, last = err.splitlines()
            assert last == refusal("admin", admin_port)
            assert any('"event": "daemon.refused_to_start"' in line for line in log), err

    code, out, err = await run_procurd("--config", str(config), "status", env=environment())
    assert code == 0, err
    daemon, failures = out.splitlines()[1:3]
    assert daemon == (
        "daemon: NOT RUNNING: no procurd daemon is alive (none has ever run on this database). Orders are "
        "taken in but not procured until `procurd run` (systemctl start procurd) runs."
    )
    host = socket.gethostname()
    reason = refusal("admin", admin_port).removeprefix("procurd: not starting: ")
    assert re.fullmatch(
        rf" {{8}}{host}: failed 3 times since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC, the last "
        rf"(just now|\d+ s ago): could not start: {re.escape(reason)}\. Instance {host}:\d+, "
        rf"procurd {re.escape(__version__)}\.",
        failures,
    ), failures
    assert await sql_rows(database_url, select(instances)) == []
    assert await sql_rows(database_url, select(alerts.c.key, alerts.c.count)) == [
        (f"daemon_failed:{host}", 3)
    ]


async def test_a_failed_start_beside_a_running_instance_disturbs_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """A second `procurd run` with the running daemon's own configuration (its ports taken) fails and
    changes nothing of the running instance: its row, its leases (it loses none, nobody else takes one),
    its claims (no `claim_abandoned`); three heartbeats later nobody has found a vanished instance (no
    `instance_down`)."""
    async with Sandbox(SandboxConfig(products=2, allow_private_callbacks=True)) as sandbox:
        data = config_data(database_url, ("main", sandbox), server={"heartbeat_seconds": 0.2})
        config = write_config(tmp_path, data)
        daemon = Daemon(settings_of(data), notifier=Notifier({}))
        await daemon.start()
        try:
            me = daemon.runtime.instance

            async def held() -> set[str] | None:
                rows = await sql_rows(database_url, select(leases.c.name).where(leases.c.holder == me))
                return {row.name for row in rows} or None

            before = await wait_until(held)
            code, out, err = await run_procurd("--config", str(config), "run", env=environment())
            assert (code, out, err.splitlines()[-1]) == (
                1,
                "",
                refusal("public", data["server"]["public_port"]),
            )
            [row] = await sql_rows(database_url, select(instances))
            assert (row.id, row.stopped_at, row.down_at) == (me, None, None)
            three_beats_later = utcnow() + timedelta(seconds=0.7)

            async def beaten() -> bool:
                [current] = await sql_rows(database_url, select(instances))
                return bool(current.heartbeat_at > three_beats_later)

            await wait_until(beaten)
            # The daemon may have taken more singletons meanwhile (they are taken when due); it lost none,
            # and nobody else holds one.
            assert before <= (await held() or set())
            assert await sql_rows(database_url, select(leases.c.name).where(leases.c.holder != me)) == []
            abandoned = select(audit_log).where(
                audit_log.c.event.in_(["claim_abandoned", "poll_claim_abandoned"])
            )
            assert await sql_rows(database_url, abandoned) == []
            assert await sql_rows(database_url, select(alerts).where(alerts.c.kind == "instance_down")) == []
            [row] = await sql_rows(database_url, select(instances))
            assert (row.id, row.stopped_at, row.down_at) == (me, None, None)
        finally:
            await daemon.shutdown()


async def test_a_daemon_stopped_by_a_failure_is_alerted_and_stopped_cleanly(database_url: str) -> None:
    """A daemon whose background work fails stops (exit 1 under systemd, which restarts it), marks its
    instance stopped (not down) and raises `daemon_failed` with the failure, one key for its host."""
    async with Sandbox(SandboxConfig(products=2, allow_private_callbacks=True)) as sandbox:
        daemon = Daemon(settings_for(database_url, ("main", sandbox)), notifier=Notifier({}))
        await daemon.start()

        async def fails() -> None:
            raise RuntimeError("a worker broke")

        try:
            daemon.supervisor.spawn(fails(), "a failing worker")
            await asyncio.wait_for(daemon.wait(), 20)
        finally:
            await daemon.shutdown()
    assert daemon.supervisor.failure is not None
    [row] = await sql_rows(database_url, select(instances))
    assert (row.stopped_at is not None, row.down_at) == (True, None)
    [(key, count, message)] = await sql_rows(
        database_url, select(alerts.c.key, alerts.c.count, alerts.c.message)
    )
    assert (key, count) == (f"daemon_failed:{socket.gethostname()}", 1)
    assert message.startswith("stopped on a failure: RuntimeError: a worker broke. Instance ")


async def test_a_restart_under_the_same_id_takes_over_from_the_dead_one(database_url: str) -> None:
    """A container restarted with the same host name and process id records itself under the id of the one
    that died: that one's leases are freed and `instance_down` raised before the new one is recorded."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        runtime = Runtime.build(settings_for(database_url, ("main", sandbox)))
        try:
            now = utcnow()
            me = runtime.instance
            host, pid = me.rsplit(":", 1)
            crashed = Instance(id=me, host=host, pid=int(pid), version="0", started_at=now, heartbeat_at=now)
            await runtime.database.write(lambda tx: tx.instances.register(crashed))
            assert await runtime.database.write(lambda tx: tx.leases.acquire("job:ping:main", me, now, 600))
            await Heartbeat(runtime).start()
            [row] = await sql_rows(runtime.database, select(instances))
            assert (row.id, row.version, row.down_at) == (me, __version__, None)
            assert await sql_rows(runtime.database, select(leases).where(leases.c.holder == me)) == []
            [alert] = await sql_rows(runtime.database, select(alerts))
            assert alert.key == f"instance_down:{me}"
        finally:
            await runtime.close()
