"""Helpers for tests of procurd as a provider (the upstream of other sites): a provider's configuration, its
accounts, and a provider seen as an upstream site by the next procurd down the chain."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

from procurd.catalog.sync import SyncReport
from procurd.config import Settings
from procurd.core.provider import ProviderOrder
from procurd.core.records import LedgerEntry
from procurd.daemon import Daemon
from procurd.operations import Operations
from procurd.sandbox import SandboxConfig
from support import UpstreamSite, config_data, wait_until

MARKUP_PERCENT = "10"


def provider_config(
    database_url: str, *upstreams: tuple[str, UpstreamSite], **sections: Mapping[str, Any]
) -> dict[str, Any]:
    """A procurd that sells its mirror of ``upstreams`` (as the TOML file holds it): ``[provider]`` on, in
    CNY, callbacks to loopback allowed, every SKU priced at cost plus 10 %. ``sections`` update the
    defaults section by section (``provider`` and ``pricing`` included)."""
    defaults: dict[str, dict[str, Any]] = {
        "provider": {
            "enabled": True,
            "site_name": "procurd provider",
            "currency": "CNY",
            "allow_private_callback_url": True,
        },
        "pricing": {"rules": [{"markup_percent": MARKUP_PERCENT}]},
    }
    for section, values in sections.items():
        defaults[section] = {**defaults.get(section, {}), **values}
    return config_data(database_url, *upstreams, **defaults)


def provider_settings(
    database_url: str, *upstreams: tuple[str, UpstreamSite], **sections: Mapping[str, Any]
) -> Settings:
    return Settings(**provider_config(database_url, *upstreams, **sections))


@dataclass(frozen=True)
class ProviderSite:
    """A provider's signed API as one account sees it: what a downstream procurd (or a test's
    :class:`~procurd.sandbox.testing.SignedClient`) is configured with."""

    base_url: str
    account: str
    api_key: str
    api_secret: str = field(repr=False)
    header_prefix: str = "Service"

    @property
    def config(self) -> SandboxConfig:
        """The credentials in the shape :func:`support.config_data` reads from a sandbox."""
        return SandboxConfig(
            api_key=self.api_key, api_secret=self.api_secret, header_prefix=self.header_prefix
        )


def public_base_url(settings: Settings) -> str:
    """The site root of a procurd's public listener (where its provider API is served)."""
    return f"http://127.0.0.1:{settings.server.public_port}"


async def add_account(
    operations: Operations, name: str, *, balance: str = "1000.00", level: str | None = None
) -> ProviderSite:
    """A new account on the provider, its wallet topped up to ``balance`` (and at ``level``)."""
    account, secret = await operations.provider.accounts.add(name)
    if balance != "0":
        await operations.provider.accounts.move(name, balance, "test balance", topup=True)
    if level is not None:
        await operations.provider.accounts.set_level(name, level)
    return ProviderSite(
        public_base_url(operations.settings),
        name,
        account.api_key,
        secret,
        operations.settings.provider.header_prefix,
    )


async def settled(daemon: Daemon) -> None:
    """Wait for what a provider daemon starts in the background at start-up (the repricing that gives the
    mirror its selling prices, the offered catalogue's rebuild), then bring the offered catalogue in step
    with the mirror once more: what the provider's API answers from now on is the mirror's."""
    started = [task for task in daemon.operations.catalog.tasks.values() if not task.done()]
    if started:
        await asyncio.wait(started)
    await daemon.operations.provider.refresh(full=True)


async def full_pass(operations: Operations, upstream: str) -> SyncReport:
    """A full catalogue pass of ``upstream`` run now (waiting while a pass of the daemon's own holds the
    upstream's lease); it must end ``ok``."""

    async def ran() -> SyncReport | None:
        report = await operations.catalog.sync(upstream, full=True)
        return None if report.status == "skipped" else report

    report = await wait_until(ran)
    assert report.status == "ok", report.error
    return report


async def ledger(operations: Operations, account: str) -> list[LedgerEntry]:
    """Every wallet movement of ``account`` on the provider, the oldest first."""
    found = await operations.provider.accounts.get(account)
    _, entries = await operations.runtime.database.read(lambda tx: tx.provider.ledger(found.id, 1, 10_000))
    return list(reversed(entries))


async def provider_order_of(
    operations: Operations, account_id: int, downstream_order_no: str
) -> ProviderOrder | None:
    """The provider's order from account ``account_id`` under ``downstream_order_no``, if it has one."""
    key = (account_id, downstream_order_no)
    found = await operations.runtime.database.read(lambda tx: tx.provider.orders_by_downstream([key]))
    order: ProviderOrder | None = found.get(key)
    return order


class NamedResolver(AbstractResolver):
    """A DNS of the test's own: fixed addresses for the names it holds (never the machine's hosts file or
    resolver), and "name not known" for any other, as a resolver answers an unknown name. ``asked`` lists
    every name it was asked for."""

    def __init__(self, names: Mapping[str, Sequence[str]]) -> None:
        self.names = {name.lower(): list(addresses) for name, addresses in names.items()}
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        addresses = self.names.get(host.lower().rstrip("."))
        if not addresses:
            raise OSError(socket.EAI_NONAME, f"{host}: name not known")
        results: list[ResolveResult] = []
        for text in addresses:
            address = ipaddress.ip_address(text)
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            results.append(
                {"hostname": host, "host": str(address), "port": port, "family": family, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}
            )  # fmt: skip
        return results

    async def close(self) -> None:
        return None
