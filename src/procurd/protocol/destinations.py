"""Where a downstream's callback may go: public addresses only, checked when the callback is sent.

A ``callback_url`` is a downstream site's word; procurd connects to it. Its host is checked as written (a DNS
name or a canonical IP literal, public when it is an address: :mod:`procurd.core.addresses`), and a name is
resolved when the callback is sent by :class:`PublicResolver`, which hands the HTTP client only the
resolved addresses that are public. The connection is then made to one of those very addresses: no second
lookup happens between the check and the connection, so a name that answers a public address to one query
and a private one to the next (DNS rebinding) gains nothing. A name with no public address is refused
(:class:`NotPublic`) and nothing is sent. Redirects are never followed by the sender.
"""

from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from procurd.core.addresses import address_kind


class NotPublic(OSError):
    """The callback's host is not, or resolves to no, public address; the message says why (for the
    order's delivery log)."""


class PublicResolver(AbstractResolver):
    """Resolves with ``inner`` and answers only the public addresses; :class:`NotPublic` when none is."""

    def __init__(self, inner: AbstractResolver) -> None:
        self.inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self.inner.resolve(host, port, family)
        public: list[ResolveResult] = []
        refused: list[str] = []
        for result in found:
            try:
                address = ipaddress.ip_address(result["host"])
            except ValueError:
                refused.append(f"{result['host']} (not an address)")
                continue
            kind = address_kind(address)
            if kind is None:
                public.append(result)
            else:
                refused.append(f"{address}, {kind}")
        if not public:
            listed = "; ".join(dict.fromkeys(refused)) or "no address"
            raise NotPublic(f"host {host} resolves to no public address ({listed})")
        return public

    async def close(self) -> None:
        await self.inner.close()
