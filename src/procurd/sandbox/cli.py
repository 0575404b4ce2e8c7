"""``procurd sandbox``: run the sandbox upstream on loopback until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path

import click
from click.core import ParameterSource

from procurd.logs import configure_logging
from procurd.sandbox.acgfaka import DEFAULT_APP_KEY, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.shop import parse_version
from procurd.sandbox.config import DEFAULT_API_SECRET, DIALECTS, SandboxConfig
from procurd.sandbox.server import Sandbox

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "console", "auto")
PROTOCOLS = ("dujiao", "acg-faka")
# Options of one protocol's sandbox only (the others apply to both).
DUJIAO_OPTIONS = (
    "skus_per_product",
    "api_key",
    "api_secret",
    "api_secret_file",
    "header_prefix",
    "allow_private_callbacks",
    "rate_limit",
    "manual_ratio",
    "callback_retry_delays",
    "currency",
    "balance_failure",
    "ignore_updated_after",
)
ACG_FAKA_OPTIONS = ("app_id", "app_key", "app_key_file", "acg_version")


def parse_delays(text: str) -> tuple[float, ...]:
    """``"30,60,120,300"`` to ``(30.0, 60.0, 120.0, 300.0)``; an empty text means no retries."""
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter("expected seconds separated by commas, like 30,60,120,300") from None
    if any(delay < 0 for delay in delays):
        raise click.BadParameter("delays must not be negative")
    return delays


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise click.BadParameter(f"{text!r} is not a decimal amount") from None
    if not value.is_finite() or value < 0:
        raise click.BadParameter("must be a finite amount of at least 0")
    return value


def _read_secret(api_secret: str | None, api_secret_file: Path | None) -> str:
    if api_secret is not None and api_secret_file is not None:
        raise click.UsageError("give --api-secret or --api-secret-file, not both")
    if api_secret_file is not None:
        try:
            secret = api_secret_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {api_secret_file}: {type(exc).__name__}") from None
        if not secret:
            raise click.BadParameter(f"{api_secret_file} is empty")
        return secret
    return api_secret if api_secret is not None else DEFAULT_API_SECRET


def _read_key(app_key: str | None, app_key_file: Path | None) -> str:
    if app_key is not None and app_key_file is not None:
        raise click.UsageError("give --app-key or --app-key-file, not both")
    if app_key_file is None:
        return app_key if app_key is not None else DEFAULT_APP_KEY
    try:
        key = app_key_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {app_key_file}: {type(exc).__name__}") from None
    if not key:
        raise click.BadParameter(f"{app_key_file} is empty")
    return key


def describe_listener(config: SandboxConfig, base_url: str) -> str:
    """The one line printed at start: where to connect and with which key (the secret only when it is the
    well-known default)."""
    secret = config.api_secret if config.api_secret == DEFAULT_API_SECRET else "(as given)"
    dialect = "Dujiao-Next of 2026" if config.speaks_2026 else "seed 000"
    return (
        f"procurd sandbox listening on {base_url} (signed API {base_url}/api/v1/upstream, "
        f"control API {base_url}/_sandbox): api key {config.api_key}, api secret {secret}, "
        f"header prefix {config.header_prefix}, speaking {dialect}"
    )


def describe_shop(config: ShopConfig, base_url: str) -> str:
    """The acg-faka shop's line at start: where, as which member, with which key (only the default)."""
    key = config.app_key if config.app_key == DEFAULT_APP_KEY else "(as given)"
    return (
        f"procurd sandbox (acg-faka {config.version}) listening on {base_url} (shared API {base_url}/shared, "
        f"control API {base_url}/_sandbox): app_id {config.app_id}, app_key {key}"
    )


async def serve(
    config: SandboxConfig | ShopConfig, host: str, port: int, on_ready: Callable[[str], None]
) -> None:
    """Run the sandbox until SIGINT or SIGTERM, then shut it down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    sandbox = Sandbox(config) if isinstance(config, SandboxConfig) else AcgFakaSandbox(config)
    try:
        await sandbox.start(host, port)
        on_ready(sandbox.base_url)
        await stop.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        await sandbox.close()


@click.command("sandbox")
@click.option(
    "--protocol",
    type=click.Choice(PROTOCOLS),
    default="dujiao",
    show_default=True,
    help="dujiao: a Dujiao-Next site (signed procurement API); acg-faka: an acg-faka shop (/shared API).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=9000, show_default=True, type=click.IntRange(0, 65535), help="0 = any free port."
)
@click.option(
    "--products",
    default=40,
    show_default=True,
    type=click.IntRange(0),
    help="Active products (acg-faka: commodities).",
)
@click.option("--skus-per-product", default=3, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=1, show_default=True, type=int, help="Same seed, same catalogue.")
@click.option("--balance", default="1000.00", show_default=True, help="Starting wallet balance.")
@click.option("--api-key", default="sandbox-key", show_default=True)
@click.option("--api-secret", default=None, help="Default: sandbox-secret.")
@click.option(
    "--api-secret-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Read the API secret from this file.",
)
@click.option(
    "--header-prefix", default="Service", show_default=True, help="Header names <prefix>-Api-Key ..."
)
@click.option(
    "--allow-private-callbacks/--no-allow-private-callbacks",
    default=True,
    show_default=True,
    help="Accept loopback and private callback_url hosts (real sites refuse them).",
)
@click.option(
    "--rate-limit/--no-rate-limit", default=False, show_default=True, help="60 requests a minute per key."
)
@click.option("--manual-ratio", default=0.25, show_default=True, type=click.FloatRange(0, 1))
@click.option(
    "--callback-retry-delays",
    default="30,60,120,300",
    show_default=True,
    help="Seconds between callback tries.",
)
@click.option("--site-name", default="procurd sandbox", show_default=True, help="The site's (shop's) name.")
@click.option(
    "--app-id", default=1000, show_default=True, type=click.IntRange(1), help="acg-faka: the member id."
)
@click.option(
    "--app-key", default=None, help=f"acg-faka: the member's docking key. Default: {DEFAULT_APP_KEY}."
)
@click.option(
    "--app-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="acg-faka: read the docking key from this file.",
)
@click.option(
    "--acg-version", default="3.6.0", show_default=True, help="acg-faka: the version the shop behaves as."
)
@click.option("--currency", default="CNY", show_default=True)
@click.option(
    "--balance-failure",
    type=click.Choice(["payment_failed", "insufficient_balance"]),
    default="payment_failed",
    show_default=True,
    help="How an order the wallet cannot pay is answered.",
)
@click.option(
    "--ignore-updated-after",
    is_flag=True,
    help="List every product whatever GET /products?updated_after= asks, like an older site.",
)
@click.option(
    "--dialect",
    type=click.Choice(DIALECTS),
    default="seed",
    show_default=True,
    help="seed: seed 000 as written; 2026: Dujiao-Next since mid-2026 (HTTP 429 over the limit, "
    "include_inactive listings, page size 50, 200 for an inactive product's detail, 500 for purchase "
    "limits, wholesale charges).",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="info",
    show_default=True,
    help="Log this and worse.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="auto",
    show_default=True,
    help="json, console, or auto (readable lines on a terminal, JSON elsewhere), as procurd's own.",
)
@click.pass_context
def sandbox_command(
    ctx: click.Context,
    protocol: str,
    host: str,
    port: int,
    products: int,
    skus_per_product: int,
    seed: int,
    balance: str,
    api_key: str,
    api_secret: str | None,
    api_secret_file: Path | None,
    header_prefix: str,
    allow_private_callbacks: bool,
    rate_limit: bool,
    manual_ratio: float,
    callback_retry_delays: str,
    site_name: str,
    app_id: int,
    app_key: str | None,
    app_key_file: Path | None,
    acg_version: str,
    currency: str,
    balance_failure: str,
    ignore_updated_after: bool,
    dialect: str,
    log_level: str,
    log_format: str,
) -> None:
    """Run a faithful upstream site on loopback for trying procurd out: a Dujiao-Next site (signed
    procurement API), or with --protocol acg-faka an acg-faka shop (its shared-shop API)."""
    foreign = ACG_FAKA_OPTIONS if protocol == "dujiao" else DUJIAO_OPTIONS
    given = [name for name in foreign if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if given:
        option = "--" + given[0].replace("_", "-")
        raise click.UsageError(f"{option} does not apply to --protocol {protocol}")
    if protocol == "acg-faka":
        try:
            parse_version(acg_version)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--acg-version") from None
        shop = ShopConfig(
            version=acg_version,
            app_id=app_id,
            app_key=_read_key(app_key, app_key_file),
            balance=_decimal(balance),
            commodities=products,
            seed=seed,
        )
        if ctx.get_parameter_source("site_name") is ParameterSource.COMMANDLINE:
            shop.shop_name = site_name
        _run(shop, host, port, log_level, log_format, lambda url: describe_shop(shop, url))
        return
    config = SandboxConfig(
        api_key=api_key,
        api_secret=_read_secret(api_secret, api_secret_file),
        header_prefix=header_prefix,
        site_name=site_name,
        currency=currency,
        balance=_decimal(balance),
        products=products,
        skus_per_product=skus_per_product,
        seed=seed,
        manual_ratio=manual_ratio,
        allow_private_callbacks=allow_private_callbacks,
        rate_limit=rate_limit,
        callback_retry_delays=parse_delays(callback_retry_delays),
        balance_failure="insufficient_balance"
        if balance_failure == "insufficient_balance"
        else "payment_failed",
        honour_updated_after=not ignore_updated_after,
        dialect="2026" if dialect == "2026" else "seed",
    )
    _run(config, host, port, log_level, log_format, lambda url: describe_listener(config, url))


def _run(
    config: SandboxConfig | ShopConfig,
    host: str,
    port: int,
    log_level: str,
    log_format: str,
    describe: Callable[[str], str],
) -> None:
    configure_logging(log_level, log_format)
    try:
        asyncio.run(serve(config, host, port, lambda url: click.echo(describe(url))))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
