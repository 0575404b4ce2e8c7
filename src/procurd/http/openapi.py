"""``GET /openapi.yaml`` on the admin listener: the HTTP API's description (``openapi.yaml``, shipped in the
package), served for this installation.

The document served is the shipped one with two things made exact for the daemon that serves it: each
listener's first server is its real address (the admin listener's: where the document was fetched; the
public listener's: the origin of ``[server] callback_url``), and the provider's signed API is left out when
``[provider] enabled`` is off (those paths then answer 404). Its text is JSON (without the shipped file's
comment lines), which any YAML reader reads too.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from procurd.config import Settings
from procurd.http.errors import RUNTIME
from procurd.protocol.dujiao import API_PREFIX
from procurd.protocol.dujiao.callback import CALLBACK_PATH

DOCUMENT_PATH = "/openapi.yaml"
CONTENT_TYPE = "application/yaml"
# A Host header as an address can be written (a name or IPv4 address, or [IPv6], and a port).
HOST = re.compile(r"(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


@cache
def shipped_document() -> dict[str, Any]:
    """The document as shipped (``procurd/http/openapi.yaml``: JSON after its leading comment lines)."""
    text = (files("procurd.http") / "openapi.yaml").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    document: dict[str, Any] = json.loads(body)
    return document


def is_provider_path(path: str) -> bool:
    """A path of the provider's signed API (everything under ``/api/v1/upstream`` but the callback)."""
    return path.startswith(API_PREFIX + "/") and path != CALLBACK_PATH


def public_origin(settings: Settings) -> str:
    """Where upstreams and downstream sites reach the public listener: the origin of ``callback_url``."""
    parts = urlsplit(settings.server.callback_url)
    if parts.scheme and parts.netloc:
        return f"{parts.scheme}://{parts.netloc}"
    server = settings.server
    return f"http://{server.public_host}:{server.public_port}"


def admin_origin(request: web.Request) -> str:
    """The admin listener as this client reached it (its ``Host``), or as configured."""
    host = request.host
    if not HOST.fullmatch(host):
        server = request.app[RUNTIME].settings.server
        host = f"{server.admin_host}:{server.admin_port}"
    return f"{request.scheme}://{host}"


def installation_document(settings: Settings, admin: str) -> dict[str, Any]:
    """The shipped document for this installation, its admin listener at ``admin``."""
    shipped = shipped_document()
    admin_server = {"url": admin, "description": "This installation's admin listener."}
    public_server = {
        "url": public_origin(settings),
        "description": "This installation's public listener (the origin of `[server] callback_url`).",
    }
    paths: dict[str, Any] = {}
    for path, item in shipped["paths"].items():
        if is_provider_path(path) and not settings.provider.enabled:
            continue
        listeners = item.get("x-procurd-listener", [])
        if "public" in listeners:
            mine = [public_server] if listeners == ["public"] else [admin_server, public_server]
            item = {**item, "servers": mine + [s for s in item.get("servers", []) if "variables" in s]}
        paths[path] = item
    return {**shipped, "servers": [admin_server, *shipped["servers"]], "paths": paths}


async def serve_document(request: web.Request) -> web.Response:
    """The API's description for this installation (``application/yaml``; its text is JSON)."""
    document = installation_document(request.app[RUNTIME].settings, admin_origin(request))
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return web.Response(text=text, content_type=CONTENT_TYPE, charset="utf-8")
