"""The limits on JSON from outside (pure): the quick look at raw bytes never passes what the walk refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procurd.core.json_limits import MAX_DEPTH, json_problem, raw_json_is_plain

TEXTS = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec=None, categories=["Cs", "Cc", "Cf", "So"]), max_size=6),
    st.sampled_from(
        [
            "\x00",
            "a\x00",
            "\ud800",
            "x\udfff",
            "\ude42\ud83d",
            "🙂",
            "\\u0000",
            "\\",
            "\\ud83d",
            "\\ud83d\ude42",
            "{[",
            "é",
        ]
    ),
)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), TEXTS),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(TEXTS, children, max_size=4)),
    max_leaves=40,
)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def encodings(value: Any) -> list[bytes]:
    """The ways an upstream may send ``value``: escaped ASCII, raw UTF-8 (lone surrogates written as their
    bytes, which the decoder lets through), UTF-16."""
    escaped = json.dumps(value, ensure_ascii=True)
    raw = json.dumps(value, ensure_ascii=False)
    return [escaped.encode(), raw.encode("utf-8", "surrogatepass"), raw.encode("utf-16", "surrogatepass")]


@given(VALUES)
def test_a_plain_document_holds_nothing_the_walk_would_refuse(value: Any) -> None:
    """Whatever the value and however it is encoded, a document the quick look calls plain decodes to a value
    in which the full walk finds no NUL, no surrogate and no nesting beyond the limit."""
    for raw in encodings(value):
        if raw_json_is_plain(raw):
            assert json_problem(json.loads(raw)) is None, raw


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "x\\u0000y"}',
        b'{"a": "\\ud800"}',
        b'{"a": "\\uDFFF"}',
        b'{"a": "\\ud83d"}',
        b'{"a": "\\ude42\\ud83d"}',  # the wrong way round
        b'{"a": "\\\\ud83d\\ude42"}',  # an escaped backslash, the text "ud83d", then a lone low surrogate
        '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),
        '{"a": "b"}'.encode("utf-16"),
        json.dumps(nested(MAX_DEPTH + 1)).encode(),
    ],
)
def test_what_may_decode_to_a_problem_is_left_to_the_walk(raw: bytes) -> None:
    """Escapes of a NUL or a surrogate, surrogates as raw bytes, a UTF-16 document and more brackets than the
    depth limit are never called plain."""
    assert not raw_json_is_plain(raw)


def test_an_ordinary_callback_is_plain() -> None:
    """A callback as upstreams send it, with a delivered fulfillment, needs no walk."""
    callback = {
        "event": "order.delivered",
        "order_id": 101,
        "downstream_order_no": "A1001",
        "status": "delivered",
        "fulfillment": {"type": "auto", "payload": "CARD-1\nCARD-2", "delivery_data": {"note": "é 🙂"}},
    }
    assert raw_json_is_plain(json.dumps(callback).encode())
    assert raw_json_is_plain(json.dumps(callback, ensure_ascii=False).encode())


def test_nesting_up_to_the_limit_is_plain() -> None:
    """As many brackets as the depth limit allows levels is still plain; the walk agrees."""
    raw = json.dumps(nested(MAX_DEPTH)).encode()
    assert raw_json_is_plain(raw)
    assert json_problem(json.loads(raw)) is None
