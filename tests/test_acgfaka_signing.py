"""acg-faka's signature: the nine vectors of the protocol's description, PHP's key order, and the form body
that carries exactly what was signed (checked by the sandbox shop, which signs what PHP parsed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from procurd.protocol.acgfaka.signing import (
    SigningError,
    check_field_name,
    compare_keys,
    form_body,
    php_key,
    sign,
    signing_string,
    sorted_keys,
)
from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.testing import ControlClient, FormClient

KEY = "8F3A2C9D1E7B6A54"
CODE = "8AE80574F3CA98BE"

# (fields posted besides sign, app_key, string to sign, md5)
VECTORS: list[tuple[dict[str, Any], str, str, str]] = [
    ({"app_id": "1024"}, KEY, f"app_id=1024&key={KEY}", "1095131eb01a23659cff325ba248290b"),
    (
        {"app_id": "1024", "app_key": KEY},
        KEY,
        f"app_id=1024&app_key={KEY}&key={KEY}",
        "07bf581b48cc04485a688ec49f481368",
    ),
    (
        {"app_id": "1024", "tradeNo": "123250101120000456"},
        KEY,
        f"app_id=1024&tradeNo=123250101120000456&key={KEY}",
        "56d9a165079ff5ec4b1dfbdeb728c54e",
    ),
    (
        {"app_id": "1024", "sharedCode": CODE, "race": "月卡"},
        KEY,
        f"app_id=1024&race=月卡&sharedCode={CODE}&key={KEY}",
        "f6f6dac0b3085c6fb306a80fe21fad02",
    ),
    (
        {
            "shared_code": CODE,
            "contact": "buyer@example.com",
            "num": "2",
            "card_id": "0",
            "device": "0",
            "password": "",
            "race": "月卡",
            "request_no": "REQ0000000000000001",
            "sku": {"颜色": "红", "尺寸": "L"},
            "game_uid": "10086",
            "app_id": "1024",
        },
        KEY,
        "app_id=1024&card_id=0&contact=buyer@example.com&device=0&game_uid=10086&num=2&race=月卡"
        f"&request_no=REQ0000000000000001&shared_code={CODE}&sku[颜色]=红&sku[尺寸]=L&key={KEY}",
        "54231e57a817a6b7a5c1f897844d0fc6",
    ),
    (
        {"app_id": "1024", "code": CODE, "race": "A&B=C+D 50%"},
        KEY,
        f"app_id=1024&code={CODE}&race=A&B=C+D 50%&key={KEY}",
        "f9761421001ac69bc130642a7bcffe7c",
    ),
    (
        {"app_id": "1024", "race": "", "sku": {"颜色": ""}, "num": "1", "code": CODE},
        KEY,
        f"app_id=1024&code={CODE}&num=1&sku[颜色]=&key={KEY}",
        "ca2d59163030db7d39f2b6508bb29e41",
    ),
    (
        {"app_id": "1000", "code": "ABCDEF0123456789", "num": "1", "sku": {"0": "x"}},
        "0123456789ABCDEF",
        "app_id=1000&code=ABCDEF0123456789&num=1&sku[0]=x&key=0123456789ABCDEF",
        "bb77566acc862296d5a613f9e94d05d9",
    ),
    (
        {
            "app_id": "1024",
            "code": CODE,
            "num": "3",
            "race": "月卡",
            "sku": {"区服": "一区", "时长": "30天"},
            "card_id": "0",
        },
        KEY,
        f"app_id=1024&card_id=0&code={CODE}&num=3&race=月卡&sku[区服]=一区&sku[时长]=30天&key={KEY}",
        "ad7ce5394be0eb8dafb71653ecfbd762",
    ),
]


@pytest.mark.parametrize(("fields", "app_key", "text", "digest"), VECTORS, ids=[str(n) for n in range(1, 10)])
def test_vectors(fields: dict[str, Any], app_key: str, text: str, digest: str) -> None:
    """Each vector's string to sign and its lower-case MD5; ``sign`` itself is never signed."""
    assert signing_string(fields, app_key) == text
    assert sign(fields, app_key) == digest
    assert sign({**fields, "sign": "anything"}, app_key) == digest


def test_wire_form_of_a_raw_value() -> None:
    """Vector 6's race goes on the wire percent-encoded and is signed raw; nested fields keep their order."""
    assert form_body(VECTORS[5][0]) == f"app_id=1024&code={CODE}&race=A%26B%3DC%2BD+50%25".encode()
    body = form_body({"sku": {"b": "1", "a": "2"}, "password": ""}).decode()
    assert body == "sku%5Bb%5D=1&sku%5Ba%5D=2&password="


@pytest.fixture
async def shop() -> AsyncIterator[AcgFakaSandbox]:
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as sandbox:
        async with ControlClient(sandbox.base_url) as control:
            await control.post("/members", {"app_id": 1024, "app_key": KEY, "balance": "5.00"})
        yield sandbox


async def test_vectors_accepted_by_the_shop(shop: AcgFakaSandbox) -> None:
    """Every vector, posted as procurd's form body, passes the shop's check, which signs what PHP parsed;
    the same bodies with a digest one character off are refused 密钥错误."""
    async with FormClient(shop.base_url) as client:
        for fields, _, _, digest in VECTORS:
            accepted = await client.raw(
                "/shared/authentication/connect", form_body({**fields, "sign": digest})
            )
            assert accepted.json()["code"] == 200, fields
            wrong = digest[:-1] + ("0" if digest[-1] != "0" else "1")
            refused = await client.raw("/shared/authentication/connect", form_body({**fields, "sign": wrong}))
            assert refused.json() == {"code": 0, "msg": "密钥错误"}


async def test_vector_6_fails_on_versions_that_signed_sanitised_values(shop: AcgFakaSandbox) -> None:
    """3.0.0 - 3.1.0 signed the values their input filter had changed: vector 6 (``&`` in a value) is
    refused there, vector 4 is not."""
    shop.config.version = "3.0.5"
    async with FormClient(shop.base_url) as client:
        for index, expected in ((5, {"code": 0, "msg": "密钥错误"}), (3, None)):
            fields, _, _, digest = VECTORS[index]
            answer = (
                await client.raw("/shared/authentication/connect", form_body({**fields, "sign": digest}))
            ).json()
            if expected is None:
                assert answer["code"] == 200
            else:
                assert answer == expected


def test_php_key_order() -> None:
    """ksort as PHP 8: decimal names are integers and compare numerically, against other names as text;
    numeric strings compare numerically; the rest byte by byte (upper case first, _ between)."""
    assert php_key("10") == 10
    assert php_key("010") == "010"
    assert php_key("-0") == "-0"
    assert sorted_keys([php_key(k) for k in ("shared_code", "sharedCode", "10", "9", "app_id")]) == [
        9,
        10,
        "app_id",
        "sharedCode",
        "shared_code",
    ]
    assert compare_keys("1.5", "10") < 0  # both numeric: 1.5 < 10
    assert compare_keys(10, "9a") < 0  # "10" < "9a" as text
    fields = {"app_id": "1", "10": "x", "9": "y"}
    assert signing_string(fields, "K") == "9=y&10=x&app_id=1&key=K"


def test_names_without_a_definite_order_are_refused() -> None:
    """9 < 10 numerically, "10" < "1a" and "1a" < "9" as text: no order every sort agrees on, so no
    signature is guessed; two names PHP holds as one key are refused too."""
    with pytest.raises(SigningError, match="no order"):
        signing_string({"9": "a", "10": "b", "1a": "c"}, "K")
    with pytest.raises(SigningError, match="one field"):
        signing_string({"10": "a", 10: "b"}, "K")


def test_names_php_would_rewrite() -> None:
    """A top-level name with a dot, a space or a bracket is rewritten by PHP; a nested one only breaks on a
    bracket."""
    assert check_field_name("game_uid") is None
    assert check_field_name("game.uid") is not None
    assert check_field_name("game uid") is not None
    assert check_field_name("a[b") is not None
    assert check_field_name("区 服.x", nested=True) is None
    assert check_field_name("a]b", nested=True) is not None
