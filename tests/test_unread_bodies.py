"""Bodies nobody asked for are not read: a compressed body that inflates to a gigabyte costs the daemon next
to nothing, on both listeners.

One daemon (its provider's signed API and the callback receiver on the public listener, the admin listener
with a token) is sent a 1 MB gzip body that inflates to 1 GiB of zeros. A request refused before its body
is needed (no signature, an unknown path, a wrong admin token) is answered at once and its connection closed
with the rest of the body neither read nor decompressed; a request whose body is needed (a known key whose
signature is to be checked, an admin order) reads at most the 1 MB limit, decoded or as sent, and is
answered 413. Meanwhile ``/healthz`` answers, and the process's CPU time spent from the first byte sent to
the connection's end stays small (aiohttp's lingering read after an early answer used to decompress the
whole gigabyte: seconds of CPU per request, with the event loop held).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import resource
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio

from procurd.daemon import Daemon
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.signing import HeaderNames
from procurd.sandbox import Sandbox, SandboxConfig
from provider_support import ProviderSite, add_account, provider_settings, settled
from support import mirror, running_daemon
from test_hostile_callbacks import RawAnswer, read_answer
from test_provider_conformance import module_database_url

__all__ = ["module_database_url"]  # a fixture of this module too

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_TOKEN = "unread-bodies-admin-token-7c1e"
BODY_LIMIT = 1024 * 1024  # both listeners' (and the provider's) request body limit
# CPU time the whole exchange may cost the process (the daemon, the test's client and the database's
# threads): generous, a behaviour's bound and not a benchmark. Decompressing the gigabyte costs 2.5 s here.
CPU_BOUND_SECONDS = 0.5


def gzip_bomb() -> bytes:
    """A gzip body just under the 1 MiB limit that inflates to about 1 GiB of zeros: one member of 8 MiB
    of zeros, repeated (a gzip body may hold several members; decoders inflate them one after another)."""
    member = gzip.compress(b"\0" * (8 << 20), compresslevel=9)
    members = BODY_LIMIT // len(member)
    assert members * 8 >= 1000, "at least 1000 MiB inflated"
    return member * members


@dataclass
class Target:
    daemon: Daemon
    site: ProviderSite
    upstream_key: str
    bomb: bytes

    @property
    def public(self) -> int:
        return self.daemon.settings.server.public_port

    @property
    def admin(self) -> int:
        return self.daemon.settings.server.admin_port


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def target(module_database_url: str) -> AsyncIterator[Target]:
    async with Sandbox(SandboxConfig(products=2, skus_per_product=1, manual_ratio=0)) as top:
        settings = provider_settings(module_database_url, ("top", top), server={"admin_token": ADMIN_TOKEN})
        await mirror(settings)
        async with running_daemon(settings) as daemon:
            await settled(daemon)
            site = await add_account(daemon.operations, "downstream")
            yield Target(daemon, site, top.config.api_key, await asyncio.to_thread(gzip_bomb))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def post_bomb(
    port: int, path: str, headers: dict[str, str], body: bytes, *, wait_closed: bool = True
) -> tuple[RawAnswer, bool]:
    """``body`` posted gzip-encoded on a new connection: the answer, and whether the server closed the
    connection after it (within 10 s) rather than keep it for a next request (not waited for unless
    ``wait_closed``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: procurd", "Content-Type: application/json",
             "Content-Encoding: gzip", f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in headers.items())]  # fmt: skip
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    async def drain() -> None:
        with contextlib.suppress(ConnectionError):  # the server closed with the body unread
            await writer.drain()

    sending = asyncio.create_task(drain())
    try:
        answer = await asyncio.wait_for(read_answer(reader), 10)
        try:
            closed = wait_closed and await asyncio.wait_for(reader.read(1), 10) == b""
        except ConnectionError:  # closed with the rest of the body unread: a reset
            closed = True
        except TimeoutError:
            closed = False
        await sending
    finally:
        writer.close()
    return answer, closed


def signature_headers(prefix: str, api_key: str) -> dict[str, str]:
    """A known key with a signature that cannot match: verifying it needs the body."""
    names = HeaderNames.for_prefix(prefix)
    return {names.api_key: api_key, names.timestamp: str(int(time.time())), names.signature: "0" * 64}


ORDERS = "/api/v1/upstream/orders"
# (listener, path, headers, HTTP status, error code); headers: "none", "token", "account key", "upstream key"
CASES = {
    "provider API, unsigned": ("public", ORDERS, "none", 401, "missing_auth_headers"),
    "provider API, a known key": ("public", ORDERS, "account key", 413, "request_too_large"),
    "callback receiver, unsigned": ("public", CALLBACK_PATH, "none", 401, "missing_auth_headers"),
    "callback receiver, an upstream's key": (
        "public",
        CALLBACK_PATH,
        "upstream key",
        413,
        "payload_too_large",
    ),
    "public listener, an unknown path": ("public", "/nowhere", "none", 404, "not_found"),
    "admin listener, no token": ("admin", "/api/v1/orders", "none", 401, "unauthorized"),
    "admin listener, an order": ("admin", "/api/v1/orders", "token", 413, "payload_too_large"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_gzip_bomb_is_answered_and_closed_without_inflating_it(target: Target, case: str) -> None:
    """The bomb is answered with the request's refusal and its connection closed; ``/healthz`` answers
    meanwhile; the process spends well under a second of CPU on all of it."""
    listener, path, credentials, status, code = CASES[case]
    headers = {
        "none": {},
        "token": {"Authorization": f"Bearer {ADMIN_TOKEN}"},
        "account key": signature_headers(target.site.header_prefix, target.site.api_key),
        "upstream key": signature_headers("Service", target.upstream_key),
    }[credentials]
    port = target.public if listener == "public" else target.admin
    async with aiohttp.ClientSession() as session:
        before = cpu_seconds()
        bombing = asyncio.create_task(post_bomb(port, path, headers, target.bomb))
        async with session.get(f"http://127.0.0.1:{target.public}/healthz") as health:
            assert (health.status, await health.json()) == (200, {"ok": True})
        answer, closed = await bombing
        async with session.get(f"http://127.0.0.1:{target.public}/healthz") as health:
            assert health.status == 200
        spent = cpu_seconds() - before
    assert (answer.status, answer.body["ok"], answer.body["error_code"]) == (status, False, code), answer.text
    assert spent < CPU_BOUND_SECONDS, f"{spent:.2f} s of CPU for one refused request"
    assert closed, "the connection was kept open for the rest of the body"
    assert answer.headers.get("Connection", "").lower() == "close", answer.headers


async def test_compressed_nothing_is_bounded_by_its_declared_length(target: Target) -> None:
    """A gzip body of empty deflate blocks inflates to nothing however long it runs, so no count of what
    it inflates to stops it: sent in chunks of unknown length it is refused 400 unread, its connection
    closed; with a Content-Length (at most 1 MiB) it is read to its end, and the request goes on to its
    signature check."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = compressor.compress(b"") + compressor.flush(zlib.Z_SYNC_FLUSH)  # gzip header, one empty block
    empty_block = b"\x00\x00\x00\xff\xff"  # a stored block of no bytes, as a sync flush writes it
    nothing = head + empty_block * ((BODY_LIMIT - len(head)) // len(empty_block))
    headers = signature_headers(target.site.header_prefix, target.site.api_key)

    reader, writer = await asyncio.open_connection("127.0.0.1", target.public)
    chunked = {"Content-Encoding": "gzip", "Transfer-Encoding": "chunked", **headers}
    lines = [
        f"POST {ORDERS} HTTP/1.1",
        "Host: procurd",
        *(f"{name}: {value}" for name, value in chunked.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + f"{len(nothing):x}\r\n".encode() + nothing)
    try:
        answer = await asyncio.wait_for(read_answer(reader), 10)
    finally:
        writer.close()
    assert (answer.status, answer.body["error_code"]) == (400, "bad_request"), answer.text
    assert answer.body["error_message"] == (
        f"a compressed body must declare its Content-Length (at most {BODY_LIMIT} bytes)"
    )
    assert answer.headers.get("Connection", "").lower() == "close"

    before = cpu_seconds()
    answer, _ = await post_bomb(target.public, ORDERS, headers, nothing, wait_closed=False)
    assert (answer.status, answer.body["error_code"]) == (401, "invalid_signature"), answer.text
    assert cpu_seconds() - before < CPU_BOUND_SECONDS
