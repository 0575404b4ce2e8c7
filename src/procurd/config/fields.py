"""What the configuration's keys hold: the value types shared by its sections (amounts, URLs, networks,
durations), the base of every section, and the hosts a listener names."""

from __future__ import annotations

import ipaddress
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

T = TypeVar("T", bound=Hashable)


def repeated(values: Sequence[T]) -> T | None:
    """The first of ``values`` that they hold more than once; ``None`` when each is there once."""
    counts = Counter(values)
    return next((value for value in values if counts[value] > 1), None)


class Section(BaseModel):
    """A section of the file: unknown keys refused, the values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _optional_amount(value: object) -> str:
    """A decimal string such as ``"50.00"``, or ``""`` for none. A whole TOML number (``100``) is exact and
    taken as its decimal text (``"100"``); a TOML number with a fraction is a binary float, which cannot
    hold every amount: it is refused with the string to write instead."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    elif isinstance(value, float | Decimal):  # the file's floats are read as Decimal, an API's as float
        number = Decimal(str(value)) if isinstance(value, float) else value
        suggestion = f'"{number:.2f}"' if number.is_finite() else '"50.00"'
        raise ValueError(
            f"must be a decimal string such as {suggestion}: a number with a fraction is read as a binary "
            "float, which cannot hold every amount exactly"
        )
    if not isinstance(value, str):
        raise ValueError('must be a decimal string such as "50.00", or "" for none')
    if value == "":
        return value
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise ValueError('must be a decimal string such as "50.00", or "" for none') from None
    if not amount.is_finite() or amount < 0:
        raise ValueError("must be a finite, non-negative amount")
    return value


OptionalAmount = Annotated[str, BeforeValidator(_optional_amount)]


def http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


HttpUrl = Annotated[str, AfterValidator(http_url)]


def _network(value: str) -> str:
    """An IP address or network (``10.0.0.0/8``), in its canonical form."""
    try:
        network = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError("must be an IP address or a network such as 10.0.0.0/8") from None
    return str(network) if network.num_addresses > 1 else str(network.network_address)


Network = Annotated[str, AfterValidator(_network)]
PositiveSeconds = Annotated[float, Field(gt=0)]


def _optional_hours(value: object) -> float | str:
    """A number of hours above 0, or ``""`` for off."""
    if value == "":
        return ""
    if not isinstance(value, bool) and isinstance(value, int | float | str | Decimal):
        try:
            hours = float(value)
        except ValueError:
            hours = float("nan")
        if math.isfinite(hours) and hours > 0:
            return hours
    raise ValueError('must be a number of hours above 0, or "" for off')


OptionalHours = Annotated[float | Literal[""], BeforeValidator(_optional_hours)]
NonNegativeDays = Annotated[float, Field(ge=0)]  # 0 = keep forever


def _config_decimal(value: Any) -> Any:
    """Decimals in the file are text or integers (a TOML float is read exactly); kept as given."""
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise ValueError(f'must be a decimal number written as text, like "1.5" (got {value!r})')
    return value


ConfigDecimal = Annotated[Any, AfterValidator(_config_decimal)]


def one_secret_form(key: str, value: SecretStr | None, file: Path | None) -> None:
    if value is not None and value.get_secret_value() and file is not None:
        raise ValueError(f"{key}, {key}_file: both are set; set one of them, not both")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# Addresses that listen on every interface of their family.
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "*"})


def hosts_overlap(first: str, second: str) -> bool:
    """Whether listeners on ``first`` and ``second`` would compete for the same port: the same address, a
    wildcard, or ``localhost`` and a loopback address. Names other than ``localhost`` are not resolved."""

    def addresses(host: str) -> set[str]:
        host = host.strip("[]").lower()
        if host in ("localhost", "localhost.localdomain"):
            return {"127.0.0.1", "::1"}
        try:
            return {str(ipaddress.ip_address(host))}
        except ValueError:
            return {host}

    if first.strip("[]") in WILDCARD_HOSTS or second.strip("[]") in WILDCARD_HOSTS:
        return True
    return bool(addresses(first) & addresses(second))
