"""Helpers for tests that drive the sandbox acg-faka shop over real sockets (no pytest import here).

- :class:`FormClient`: posts form bodies to the shop as they are given (signed or not, on purpose broken),
  and reads its answers; independent of procurd's own client.
- :func:`shop_settings`: an ``[[upstreams]]`` block of ``protocol = "acg-faka"`` for a running sandbox.
- The control API is the Dujiao-Next sandbox's :class:`~procurd.sandbox.testing.ControlClient` (the same
  JSON conventions under ``/_sandbox``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import aiohttp

from procurd.config import UpstreamSettings
from procurd.protocol.acgfaka.signing import Fields, form_body, sign
from procurd.sandbox.acgfaka.shop import DEFAULT_APP_ID, DEFAULT_APP_KEY
from procurd.sandbox.testing import ControlClient, _SessionClient

__all__ = ["ControlClient", "FormClient", "ShopAnswer", "shop_settings"]


@dataclass
class ShopAnswer:
    status: int
    body: bytes
    content_type: str
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body, parse_float=Decimal)

    @property
    def is_html(self) -> bool:
        return self.content_type == "text/html"


class FormClient(_SessionClient):
    """Posts to ``base_url`` + a path; :meth:`signed` adds ``app_id`` and ``sign`` as the protocol says."""

    def __init__(self, base_url: str, app_id: int = DEFAULT_APP_ID, app_key: str = DEFAULT_APP_KEY) -> None:
        self.base_url = base_url.rstrip("/")
        self.app_id = app_id
        self.app_key = app_key
        super().__init__()

    async def raw(
        self,
        path: str,
        body: bytes | None = None,
        *,
        method: str = "POST",
        content_type: str = "application/x-www-form-urlencoded",
        headers: Mapping[str, str] | None = None,
    ) -> ShopAnswer:
        request_headers = {"Content-Type": content_type, **(headers or {})} if body is not None else {}
        async with self._client().request(
            method,
            self.base_url + path,
            data=body,
            headers=request_headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=10),
        ) as response:
            raw = await response.read()
            return ShopAnswer(response.status, raw, response.content_type, dict(response.headers))

    async def signed(self, path: str, fields: Fields, *, app_key: str | None = None) -> ShopAnswer:
        """``fields`` with ``app_id`` and a signature under ``app_key`` (default: the client's)."""
        all_fields: dict[Any, Any] = {"app_id": str(self.app_id), **fields}
        all_fields["sign"] = sign(all_fields, self.app_key if app_key is None else app_key)
        return await self.raw(path, form_body(all_fields))


def shop_settings(base_url: str, name: str = "acg", **overrides: Any) -> UpstreamSettings:
    """The ``[[upstreams]]`` block of a sandbox shop (its default member unless ``overrides`` say)."""
    block: dict[str, Any] = {
        "name": name,
        "protocol": "acg-faka",
        "base_url": base_url,
        "app_id": str(DEFAULT_APP_ID),
        "app_key": DEFAULT_APP_KEY,
        "max_requests_per_second": 1000,
        **overrides,
    }
    return UpstreamSettings.model_validate(block)
