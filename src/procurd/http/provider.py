"""The provider's signed API on the public listener, under ``/api/v1/upstream``: the shared protocol server
(:class:`~procurd.protocol.dujiao.SignedApi`) over the provider's backend
(:class:`~procurd.provider.backend.ProviderBackend`), whose requests that fail authentication are limited per
client address as this listener tells it (the peer's, or the one ``X-Forwarded-For`` names when the peer is
one of ``[server] trusted_proxies``)."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from procurd.http.throttle import client_address, trusted_networks
from procurd.operations import Operations
from procurd.protocol.dujiao import API_PREFIX, SignedApi
from procurd.provider.backend import ProviderBackend


def add_provider_routes(app: web.Application, operations: Operations) -> None:
    """Serve the provider's signed API under ``/api/v1/upstream`` (after the callback receiver's route)."""
    trusted = trusted_networks(operations.settings.server.trusted_proxies)
    api = SignedApi(ProviderBackend(operations.provider, partial(client_address, trusted=trusted)))
    # Any character after the prefix, a newline (a decoded %0A) included: the API answers every path itself.
    app.router.add_route("*", API_PREFIX + "{tail:(/[\\s\\S]*)?}", api.dispatch)
