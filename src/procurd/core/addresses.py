"""Which hosts a URL a remote party names may be connected to (pure: nothing here resolves a name).

A ``callback_url`` a downstream site gives the provider is an address procurd connects to on that site's
word, so it must never be a way into procurd's own network. Its host must be written as a DNS name or as a
canonical IP literal: four decimal numbers (``203.0.113.7``) or an IPv6 address in brackets. The shorthand
and numeric forms that resolvers and HTTP clients quietly read as addresses (``127.1``, ``2130706433``,
``0x7f000001``, ``0x7f.0.0.1``, ``0177.0.0.1``, ``10.1``, and the full-width or enclosed digits and
ideographic full stops that IDNA normalises to them) are refused: they exist to slip past a check. An
address, written or resolved, is public only when it is none of loopback, private, link-local, multicast,
reserved, unspecified, site-local, shared (100.64.0.0/10) or otherwise not global; an IPv6 address that
embeds an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, Teredo) is judged by the address it embeds too.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import yarl

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# A last label an IPv4 parser reads as a number (decimal, octal with a leading 0, or hexadecimal): a host
# ending in one is an address, however it is written.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")
MAX_NAME_CHARS = 253
CANONICAL_HINT = "write an IP address as four decimal numbers such as 203.0.113.7, or use a DNS name"


def address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not a public address procurd may connect to on a remote party's word, or
    ``None`` when it is public."""
    kind = address_kind(address)
    return None if kind is None else f"{address} is {kind}"


def address_kind(address: IPAddress) -> str | None:
    """What kind of address that is not public ``address`` is (``"a loopback address"``), or ``None``."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            carrier, inner, always = embedded
            inner_kind = address_kind(inner)
            if always or inner_kind is not None:
                return f"{carrier} of {inner}" + (f", {inner_kind}" if inner_kind else "")
        if address.scope_id:
            return "an address of one network interface"
    kinds = (
        (address.is_unspecified, "an unspecified address"),
        (address.is_loopback, "a loopback address"),
        (address.is_link_local, "a link-local address"),
        (address.is_multicast, "a multicast address"),
        (address.is_private, "a private address"),
        (isinstance(address, ipaddress.IPv6Address) and address.is_site_local, "a site-local address"),
        (address.is_reserved, "a reserved address"),
        (not address.is_global, "not a global address"),
    )
    return next((kind for applies, kind in kinds if applies), None)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address, bool] | None:
    """The IPv4 address an IPv6 address carries, what kind of address carries it, and whether that kind is
    refused whatever it carries (an IPv4-mapped or -compatible address is the IPv4 address itself: it is to
    be written as one)."""
    if address.ipv4_mapped is not None:
        return "an IPv4-mapped address", address.ipv4_mapped, True
    value = int(address)
    if value >> 32 == 0 and value > 0xFFFF:  # ::a.b.c.d, IPv4-compatible (:: and ::1 are themselves)
        return "an IPv4-compatible address", ipaddress.IPv4Address(value), True
    if address.sixtofour is not None:
        return "a 6to4 address", address.sixtofour, False
    if address.teredo is not None:
        return "a Teredo address", address.teredo[1], False
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` is when it is written as a canonical IP literal (an IPv6 address with or without
    its brackets, or a dotted quad); ``None`` for anything else."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv4Address) and str(address) != bare:
        return None
    return address


def host_problem(host: str, normalised: str | None = None) -> str | None:
    """Why ``host`` (as written in a URL, without a port) is neither a DNS name nor a canonical IP literal,
    or is an address that is not public, or names this machine; ``None`` for a name (not resolved here) or a
    public address.

    ``normalised`` is the host as an HTTP client connects to it (IDNA: full-width digits, enclosed digits
    and ideographic full stops become ASCII); a host whose normal form is an address must already be written
    that way."""
    written = host.lower()
    ascii_host = (normalised if normalised is not None else written).lower()
    if not written or not ascii_host:
        return "has no host"
    address = literal_address(written)
    if address is not None:
        problem = address_problem(address)
        return None if problem is None else f"host {problem}"
    if "%" in written or ":" in written or written.startswith("["):
        return f"host {host!r} is not a valid IP address"
    bare = ascii_host[:-1] if ascii_host.endswith(".") else ascii_host
    labels = bare.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]) or literal_address(ascii_host) is not None:
        return f"host {host!r} is an address written in a form that is not canonical ({CANONICAL_HINT})"
    if len(bare) > MAX_NAME_CHARS or not all(_LABEL.fullmatch(label) for label in labels):
        return f"host {host!r} is not a DNS name or an IP address"
    if bare in LOCAL_NAMES or bare.endswith(".localhost"):
        return f"host {bare} names this machine"
    return None


def private_url_reason(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL whose host is a public address or a DNS name (the address a site may
    be asked to connect to on another site's word), or ``None``.

    Names are not resolved here (a name that resolves to a private address passes): the host is judged as
    written, and as an HTTP client would connect to it (full-width digits, enclosed digits and ideographic
    full stops normalised), by :func:`host_problem`.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:  # a bracketed host that is not one ("http://[::1")
        return "is not a URL"
    if parts.scheme not in ("http", "https"):
        return "not an http or https URL"
    if not host:
        return "has no host"
    try:
        normalised = yarl.URL(url).raw_host or ""
    except (ValueError, UnicodeError):
        return f"host {host!r} is not a valid host name"
    return host_problem(host, normalised)
