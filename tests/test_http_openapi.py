"""The OpenAPI document describes every route of both listeners, and nothing they do not serve: the admin API,
the callback receiver, and the provider's signed API on the public listener; each listener has servers of
its own, and what a request may hold is what the server takes."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from importlib.resources import files
from typing import Any

import pytest
from aiohttp import web

from procurd.config import Settings
from procurd.http import make_admin_app, make_public_app
from procurd.http.console import is_console_path
from procurd.http.testing import stack_settings
from procurd.operations import Operations
from procurd.operations.runtime import Runtime
from procurd.protocol.dujiao import API_PREFIX
from procurd.protocol.dujiao.server import ROUTES

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def load_document() -> dict[str, Any]:
    text = (files("procurd.http") / "openapi.yaml").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    document: dict[str, Any] = json.loads(body)
    return document


@pytest.fixture
async def apps(database_url: str) -> AsyncIterator[dict[str, web.Application]]:
    """Both applications, built on a runtime with the default callback path and the provider on."""
    settings = stack_settings(
        database_url, "http://127.0.0.1:1", "https://shop.example.com/api/v1/upstream/callback"
    )
    settings = with_provider(settings)
    operations = Operations(Runtime.build(settings))
    try:
        yield {"public": make_public_app(operations), "admin": make_admin_app(operations)}
    finally:
        await operations.close()


def with_provider(settings: Settings) -> Settings:
    return settings.model_copy(update={"provider": settings.provider.model_copy(update={"enabled": True})})


def served(app: web.Application) -> set[tuple[str, str]]:
    """(path template, method) of every route, without the HEAD aiohttp adds to each GET and the routes
    that only refuse other methods (405), of the web console only its entry page (its pages are HTML for a
    person, described in docs/console.md), and the signed API's endpoints as its server routes them."""
    routes: set[tuple[str, str]] = set()
    for route in app.router.routes():
        assert route.resource is not None
        path = route.resource.canonical
        if path.startswith(API_PREFIX + "{tail"):
            routes.update((API_PREFIX + signed_path(r.pattern.pattern), r.method.lower()) for r in ROUTES)
        elif route.method not in ("HEAD", "*") and (path == "/ui/" or not is_console_path(path)):
            routes.add((path, route.method.lower()))
    return routes


def signed_path(pattern: str) -> str:
    """A route's regular expression of the signed API as an OpenAPI path template."""
    return re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", pattern)


def documented(document: dict[str, Any], listener: str) -> Iterator[tuple[str, str]]:
    for path, item in document["paths"].items():
        if listener in item["x-procurd-listener"]:
            for method in METHODS:
                if method in item:
                    yield path, method


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def test_document_is_openapi_3_1() -> None:
    """The document parses and declares OpenAPI 3.1 with both listeners described."""
    document = load_document()
    assert document["openapi"].startswith("3.1")
    assert "public" in document["info"]["description"]
    assert "admin" in document["info"]["description"]


async def test_every_route_of_both_listeners_is_documented(apps: dict[str, web.Application]) -> None:
    """Each listener's routes and the document's operations for that listener are the same set."""
    document = load_document()
    for listener, app in apps.items():
        assert served(app) == set(documented(document, listener)), listener


def test_every_operation_documents_its_answers() -> None:
    """Every operation has a summary, an operationId and at least one success and one failure answer."""
    document = load_document()
    operation_ids = []
    for path, item in document["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method]
            operation_ids.append(operation["operationId"])
            assert operation["summary"], (path, method)
            statuses = set(operation["responses"])
            assert any(status.startswith("2") for status in statuses), (path, method)
            if path != "/healthz":
                assert any(status[0] in "45" for status in statuses), (path, method)
    assert len(operation_ids) == len(set(operation_ids))


def test_every_reference_resolves() -> None:
    """Every $ref points at a component that exists."""
    document = load_document()
    for reference in set(refs(document)):
        node: Any = document
        assert reference.startswith("#/")
        for part in reference[2:].split("/"):
            assert part in node, reference
            node = node[part]


def request_schemas(document: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every schema a request is checked against: parameters and request bodies, with their names."""
    for path, item in document["paths"].items():
        for parameter in item.get("parameters", []):
            yield f"{path} {parameter['name']}", parameter["schema"]
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            for parameter in operation.get("parameters", []):
                yield f"{method} {path} {parameter['name']}", parameter["schema"]
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                yield f"{method} {path} body", body["schema"]


def leaves(
    document: dict[str, Any], name: str, schema: Any, seen: frozenset[str] = frozenset()
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The scalar schemas inside ``schema``, following references."""
    if "$ref" in schema:
        reference = schema["$ref"]
        if reference in seen:
            return
        node: Any = document
        for part in reference[2:].split("/"):
            node = node[part]
        yield from leaves(document, name, node, seen | {reference})
        return
    for key in ("oneOf", "anyOf", "allOf"):
        for option in schema.get(key, []):
            yield from leaves(document, name, option, seen)
    for field, child in schema.get("properties", {}).items():
        yield from leaves(document, f"{name}.{field}", child, seen)
    if "items" in schema:
        yield from leaves(document, f"{name}[]", schema["items"], seen)
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds or "integer" in kinds:
        yield name, schema


# The signed API (seed 000, the real sites' behaviour) reads any integer `page` and clamps `page_size`, reads
# `updated_after` as a timestamp (`format: date-time`), and takes `include_inactive=true` as Dujiao-Next does
# (any other value is no).
READ_AS_THE_REAL_SITES_DO = {
    "get /api/v1/upstream/products page",
    "get /api/v1/upstream/products page_size",
    "get /api/v1/upstream/products updated_after",
    "get /api/v1/upstream/products include_inactive",
}


def test_request_limits_are_documented() -> None:
    """What a request may hold is what the server takes: every integer has a maximum, every free text
    excludes NUL, and the documented maxima are the server's own."""
    from procurd.core.intake import MAX_QUANTITY
    from procurd.core.numbers import MAX_ID
    from procurd.http.inputs import MAX_PAGE

    document = load_document()
    checked = 0
    for name, schema in request_schemas(document):
        for leaf, scalar in leaves(document, name, schema):
            checked += 1
            kinds = scalar["type"] if isinstance(scalar["type"], list) else [scalar["type"]]
            if leaf in READ_AS_THE_REAL_SITES_DO:
                continue
            if "integer" in kinds:
                assert "maximum" in scalar, leaf
            elif "enum" not in scalar:
                assert "pattern" in scalar, leaf
                for text in ("\x00", "A1\x00", "9\x00"):
                    assert re.search(scalar["pattern"], text) is None, (leaf, text)
    assert checked > 20
    schemas = document["components"]["schemas"]
    item = schemas["OrderItemRequest"]["properties"]
    assert (item["sku_id"]["maximum"], item["quantity"]["maximum"]) == (MAX_ID, MAX_QUANTITY)
    page = next(s for name, s in request_schemas(document) if name.endswith("/api/v1/exceptions page"))
    assert page["maximum"] == MAX_PAGE
    assert [option.get("type") for option in item["max_unit_price"]["oneOf"]] == [None, "null"]


def test_enumerations_are_the_codes_own() -> None:
    """Values the server takes or gives from a closed list are documented as that list: alert kinds (the
    filter and the alert itself), exception reasons, provider order statuses."""
    from procurd.core.alerts import KINDS
    from procurd.core.provider import ORDER_STATUSES
    from procurd.operations.views import ASSIGNED_REASONS

    document = load_document()
    parameters = {
        (path, parameter["name"]): parameter["schema"]
        for path, item in document["paths"].items()
        for parameter in item.get("get", {}).get("parameters", [])
    }
    assert set(parameters[("/api/v1/alerts", "kind")]["enum"]) == set(KINDS)
    assert set(document["components"]["schemas"]["Alert"]["properties"]["kind"]["enum"]) == set(KINDS)
    assert parameters[("/api/v1/exceptions", "reason")]["enum"] == sorted(ASSIGNED_REASONS)
    assert parameters[("/api/v1/provider/orders", "status")]["enum"] == list(ORDER_STATUSES)
    bulk = document["components"]["schemas"]["BulkRetryRequest"]["properties"]
    assert bulk["reason"]["enum"] == [*sorted(ASSIGNED_REASONS), None]


def test_each_listener_has_its_servers() -> None:
    """The admin listener is the document's server; every path the public listener serves names the public
    listener's servers itself (a path both serve names both, the admin listener first), so a client knows
    which port serves which path."""
    document = load_document()
    [admin] = document["servers"]
    assert admin["url"] == "http://{admin_host}:{admin_port}"
    for path, item in document["paths"].items():
        listeners = item["x-procurd-listener"]
        urls = [server["url"] for server in item.get("servers", [])]
        if listeners == ["admin"]:
            assert urls == [], path
        elif listeners == ["public"]:
            assert urls == ["https://{public_host}", "http://{listener_host}:{public_port}"], path
        else:
            assert urls == [admin["url"], "https://{public_host}", "http://{listener_host}:{public_port}"], (
                path
            )


def test_the_signed_api_is_described_as_served() -> None:
    """The provider's endpoints are the signed API's routes, each needs the three signature headers, and
    each documents the answers every signed request may get (authentication, the rate limit's envelope)."""
    document = load_document()
    signed = {
        (path, method)
        for path, item in document["paths"].items()
        if path.startswith(API_PREFIX + "/") and path != API_PREFIX + "/callback"
        for method in METHODS
        if method in item
    }
    assert signed == {(API_PREFIX + signed_path(r.pattern.pattern), r.method.lower()) for r in ROUTES}
    for path, method in signed:
        operation = document["paths"][path][method]
        assert operation["security"] == [
            {"accountApiKey": [], "accountTimestamp": [], "accountSignature": []}
        ]
        assert {"200", "400", "401", "403", "413", "500"} <= set(operation["responses"]), path
        answer = operation["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
        assert {"$ref": "#/components/schemas/RateLimited"} in answer, path
