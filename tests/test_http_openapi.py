"""The OpenAPI document describes every route of both listeners, and nothing they do not serve."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from importlib.resources import files
from typing import Any

import pytest
from aiohttp import web

from procurd.http import make_admin_app, make_public_app
from procurd.http.console import is_console_path
from procurd.http.testing import stack_settings
from procurd.operations import Operations
from procurd.runtime import Runtime

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def load_document() -> dict[str, Any]:
    text = (files("procurd.http") / "openapi.yaml").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    document: dict[str, Any] = json.loads(body)
    return document


@pytest.fixture
async def apps(database_url: str) -> AsyncIterator[dict[str, web.Application]]:
    """Both applications, built on a runtime with the default callback path."""
    settings = stack_settings(
        database_url, "http://127.0.0.1:1", "https://shop.example.com/api/v1/upstream/callback"
    )
    operations = Operations(Runtime.build(settings))
    try:
        yield {"public": make_public_app(operations), "admin": make_admin_app(operations)}
    finally:
        await operations.close()


def served(app: web.Application) -> set[tuple[str, str]]:
    """(path template, method) of every route, without the HEAD aiohttp adds to each GET, and of the web
    console only its entry page (its pages are HTML for a person, described in the README)."""
    routes = set()
    for route in app.router.routes():
        assert route.resource is not None
        path = route.resource.canonical
        if route.method != "HEAD" and (path == "/ui/" or not is_console_path(path)):
            routes.add((path, route.method.lower()))
    return routes


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
