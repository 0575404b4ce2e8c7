"""The OpenAPI document describes every route of both listeners, and nothing they do not serve."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from importlib.resources import files
from typing import Any

import pytest
from aiohttp import web

from procurd.http import make_admin_app, make_public_app
from procurd.http.console import is_console_path
from procurd.http.testing import stack_settings
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
    runtime = Runtime.build(settings)
    try:
        yield {"public": make_public_app(runtime), "admin": make_admin_app(runtime)}
    finally:
        await runtime.close()


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
