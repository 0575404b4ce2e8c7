"""Signing follows seed 000 part 5 to the byte."""

from __future__ import annotations

import pytest

from procurd.protocol.dujiao.signing import (
    HeaderNames,
    parse_timestamp,
    sign,
    signature_matches,
    signed_headers,
    string_to_sign,
    timestamp_fresh,
)

SECRET = "your_api_secret"
TS = 1772366400


def test_order_vector() -> None:
    """The published POST /orders vector signs to the published digest."""
    body = b'{"sku_id":1,"quantity":1}'
    assert (
        sign(SECRET, "POST", "/api/v1/upstream/orders", TS, body)
        == "88444ca5a52c0ebfb343ac92fc81723552f70fcbf589c22c0801f94458e2da7f"
    )


def test_ping_vector_empty_body() -> None:
    """An empty body is digested as the MD5 of the empty string."""
    assert (
        sign(SECRET, "POST", "/api/v1/upstream/ping", TS, b"")
        == "356c05176544b817cea6fcd96e9b7f57a64b2f86ece3748e939944d2c2076dca"
    )


def test_query_string_is_not_signed() -> None:
    """The signed path never includes the query string."""
    assert sign(SECRET, "GET", "/api/v1/upstream/products?page=2&page_size=50", TS, b"") == sign(
        SECRET, "GET", "/api/v1/upstream/products", TS, b""
    )


def test_method_is_upper_cased() -> None:
    """The method is signed in upper case whatever case the caller used."""
    assert string_to_sign("post", "/p", TS, b"").startswith("POST\n/p\n1772366400\n")


def test_digest_is_over_exact_bytes() -> None:
    """A change of a single byte of the body (even white space) changes the signature."""
    assert sign(SECRET, "POST", "/p", TS, b'{"a": 1}') != sign(SECRET, "POST", "/p", TS, b'{"a":1}')


def test_signature_matches_is_exact() -> None:
    """Verification accepts the right signature (any hex case) and rejects any other."""
    good = sign(SECRET, "POST", "/p", TS, b"x")
    assert signature_matches(SECRET, "POST", "/p", TS, b"x", good)
    assert signature_matches(SECRET, "POST", "/p", TS, b"x", good.upper())
    assert not signature_matches(SECRET, "POST", "/p", TS, b"y", good)
    assert not signature_matches("other", "POST", "/p", TS, b"x", good)
    assert not signature_matches(SECRET, "POST", "/p", TS, b"x", "zz\u00e9")


def test_header_names_follow_prefix() -> None:
    """Header names are <prefix>-Api-Key, -Timestamp and -Signature."""
    headers = signed_headers(HeaderNames.for_prefix("Dujiao-Next"), "k", SECRET, "POST", "/p", TS, b"")
    assert set(headers) == {"Dujiao-Next-Api-Key", "Dujiao-Next-Timestamp", "Dujiao-Next-Signature"}
    assert headers["Dujiao-Next-Timestamp"] == str(TS)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1772366400", 1772366400), (" 17 ", 17), ("", None), ("1.5", None), ("abc", None), ("9" * 20, None)],
)
def test_parse_timestamp(raw: str, expected: int | None) -> None:
    """Only plain integer seconds parse as a timestamp."""
    assert parse_timestamp(raw) == expected


def test_timestamp_window_is_sixty_seconds_both_ways() -> None:
    """A timestamp may differ from now by at most 60 seconds in either direction."""
    assert timestamp_fresh(TS, TS + 60)
    assert timestamp_fresh(TS, TS - 60)
    assert not timestamp_fresh(TS, TS + 61)
    assert not timestamp_fresh(TS, TS - 61)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.5, 0.999])
def test_timestamp_window_is_the_same_both_ways_at_any_fraction_of_a_second(fraction: float) -> None:
    """Whatever fraction of a second ``now`` is into, a timestamp exactly 60 s old is treated as one exactly
    60 s ahead (both fresh), and 61 s either way as stale: whole seconds on both sides, as the seed's sites
    compare them."""
    now = TS + fraction
    assert timestamp_fresh(TS - 60, now) == timestamp_fresh(TS + 60, now) is True
    assert timestamp_fresh(TS - 61, now) == timestamp_fresh(TS + 61, now) is False
