"""``procurd order``: submit, show and cancel orders through the installation's operations (daemon
running or not).

The same operations as the admin API: a submit is validated against the mirror and queued for the
submitters, a cancel goes to the upstream first (through the budget every process shares). Human output
is aligned text (:mod:`procurd.output`); ``--json`` or ``--output json`` prints what the admin API would
answer (``submit`` reads a whole request body with ``--body``). Exit codes: 0 done, 1 refused or
failed (the reason on stderr), 2 usage or configuration.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

import click

from procurd.cli.base import (
    EXIT_FAILURE,
    CliState,
    common_options,
    emit_json,
    fail_usage,
    main,
    pass_state,
    run_command,
)
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.output import Column, cell, echo, print_fields, print_table, utc, when

# --- shared by the order, exceptions and status commands -----------------------------------------------


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` and its synonym ``--output json``: print what the admin API would answer."""

    @functools.wraps(command)
    def with_output(*args: Any, as_json: bool, output: str | None, **kwargs: Any) -> Any:
        return command(*args, as_json=as_json or output == "json", **kwargs)

    with_output = click.option(
        "--output", type=click.Choice(["table", "json"]), help="table (the default) or json (as --json)."
    )(with_output)
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (what the admin API answers).")(
        with_output
    )


def print_procurement(item: Mapping[str, Any], *, show_payload: bool = False) -> None:
    """One procurement: a heading line, then its facts, one per line."""
    order = f"order {item['order_no']}, " if item.get("order_no") else ""
    echo(f"procurement {item['id']}: {order}number {item['downstream_order_no']}, {item['state']}")
    upstream_order = " ".join(
        str(part) for part in (item["upstream_order_id"], item["upstream_order_no"]) if part
    )
    amount = " ".join(str(part) for part in (item["amount"], item["currency"]) if part)
    fields: list[tuple[str, Any]] = [
        ("upstream", f"{item['upstream']}, SKU {item['sku_id']}, quantity {item['quantity']}"),
        (
            "upstream order",
            f"{upstream_order}, status {item['upstream_status']}" if upstream_order else "none yet",
        ),
    ]
    if amount:
        fields.append(("amount", amount))
    if item.get("max_unit_price"):
        fields.append(("max unit price", item["max_unit_price"]))
    fields.append(("attempts", item["attempts"]))
    if item.get("exception_reason"):
        fields.append(("exception", item["exception_reason"]))
    if item.get("last_error_code") or item.get("last_error_message"):
        fields.append(
            (
                "last error",
                ": ".join(str(p) for p in (item["last_error_code"], item["last_error_message"]) if p),
            )
        )
    if item.get("resolution_note"):
        fields.append(("resolution", item["resolution_note"]))
    fields.append(("updated", when(item.get("updated_at"))))
    fulfillment = item.get("fulfillment")
    if fulfillment:
        lines = count(fulfillment.get("payload_line_count") or 0, "line")
        delivered = (
            f"{fulfillment.get('type')}, {fulfillment.get('status')} {when(fulfillment.get('delivered_at'))}"
        )
        fields.append(("fulfillment", f"{delivered}, {lines}"))
        if not show_payload:
            fields.append(("payload", "hidden (--show-payload shows it)"))
    print_fields(fields)
    if fulfillment and show_payload:
        for line in (fulfillment.get("payload") or "").splitlines():
            echo(f"    {line}")
        if fulfillment.get("delivery_data") is not None:
            echo(f"    delivery data: {cell(fulfillment['delivery_data'])}")


def hide_payloads(order: Mapping[str, Any]) -> dict[str, Any]:
    """The order view without delivered goods (``payload`` and ``delivery_data``)."""
    procurements = []
    for item in order.get("procurements", []):
        fulfillment = item.get("fulfillment")
        if fulfillment:
            fulfillment = dict(fulfillment, payload=None, delivery_data=None, payload_hidden=True)
        procurements.append(dict(item, fulfillment=fulfillment))
    return dict(order, procurements=procurements)


def print_order(order: Mapping[str, Any], *, show_payload: bool = False) -> None:
    flags = " (exception)" if order["exception"] else ""
    echo(f"order {order['order_no']}: {order['status']}{flags}")
    details = [("trace id", order.get("trace_id")), ("created", when(order.get("created_at"))),
               ("updated", when(order.get("updated_at")))]  # fmt: skip
    print_fields([(label, value) for label, value in details if value])
    for item in order["procurements"]:
        echo()
        print_procurement(item, show_payload=show_payload)


# --- procurd order ------------------------------------------------------------------------------------------


@main.group("order")
def order_group() -> None:
    """Orders accepted for procurement."""


PRINT_JSON = "\0print"  # what --json stands for when given alone (its old use took a file name)


@order_group.command(
    "submit", options_metavar="(--order-no NO (--sku ID | --offer CODE) | --body FILE|-) [OPTIONS]"
)
@click.option(
    "--order-no", metavar="NO", help="The local (storefront) order number. [required unless --body]"
)
@click.option(
    "--sku", "sku_id", type=int, metavar="ID", help="The upstream SKU id. [this or --offer, unless --body]"
)
@click.option("--offer", metavar="CODE", help="An offer instead of a SKU (see procurd offers).")
@click.option("--quantity", type=click.IntRange(min=1), default=1, show_default=True, help="How many to buy.")
@click.option(
    "--upstream", metavar="NAME", help="The upstream (may be left out when only one is configured)."
)
@click.option("--max-unit-price", metavar="X", help='Refuse to buy above this unit price ("9.90").')
@click.option("--form-data", metavar="JSON", help="manual_form_data as a JSON object (manual products).")
@click.option(
    "--trace-id",
    metavar="ID",
    help="A correlation id of yours, kept with the order, shown in its view and sent with its upstream "
    "orders (trace_id).",
)
@click.option(
    "--allow-backorder",
    is_flag=True,
    help="Take in an item the mirror knows to be out of stock (or short of the quantity) anyway, and let "
    'the upstream decide ("allow_backorder": true); without it such an item is refused insufficient_stock.',
)
@click.option(
    "--preview",
    is_flag=True,
    help="Take nothing in: say what intake would do with this order now, item by item (exit 0 when it "
    "would be accepted, 1 when refused), as POST /api/v1/orders/preview.",
)
@click.option(
    "--body",
    "body_file",
    type=click.File("rb"),
    metavar="FILE|-",
    help="The whole request body as POSTed to /api/v1/orders (- reads it from standard input), instead of "
    "--order-no, --sku or --offer and the item options.",
)
@click.option(
    "--json",
    "json_option_value",
    is_flag=False,
    flag_value=PRINT_JSON,
    default=None,
    metavar="",
    help="Print JSON (what the admin API answers).",
)
@click.option(
    "--output", type=click.Choice(["table", "json"]), help="table (the default) or json (as --json)."
)
@common_options
@pass_state
def order_submit(
    state: CliState,
    order_no: str | None,
    sku_id: int | None,
    offer: str | None,
    quantity: int,
    upstream: str | None,
    max_unit_price: str | None,
    form_data: str | None,
    trace_id: str | None,
    allow_backorder: bool,
    preview: bool,
    body_file: IO[bytes] | None,
    json_option_value: str | None,
    output: str | None,
) -> None:
    """Accept a locally paid order for procurement (it is queued for the workers; nothing is bought here),
    or with --preview say what intake would do with it.

    Give --order-no with --sku or --offer (and the item options), or --body with a whole request body.
    """
    as_json = json_option_value == PRINT_JSON or output == "json"
    if json_option_value not in (None, PRINT_JSON):
        # `--json FILE` was this command's request body before --body; it still works, with a note.
        if body_file is not None:
            fail_usage("give --body FILE|- once (--json FILE is its old spelling)")
        click.echo("procurd: order submit --json FILE is deprecated: use --body FILE", err=True)
        body_file = click.get_current_context().with_resource(click.open_file(json_option_value, "rb"))
    if body_file is not None:
        if order_no or sku_id is not None or offer is not None:
            fail_usage("give either --body with a whole body, or --order-no and --sku (or --offer)")
        raw = body_file.read()
    else:
        if not order_no or (sku_id is None) == (offer is None):
            fail_usage(
                "--order-no and one of --sku or --offer are required (or --body FILE|- with a whole body)"
            )
        item: dict[str, Any] = {"quantity": quantity}
        if offer is not None:
            item["offer"] = offer
        else:
            item["sku_id"] = sku_id
        if upstream:
            item["upstream"] = upstream
        if max_unit_price is not None:
            item["max_unit_price"] = max_unit_price
        if form_data is not None:
            item["manual_form_data"] = _form_data(form_data)
        body: dict[str, Any] = {"order_no": order_no, "items": [item]}
        if trace_id:
            body["trace_id"] = trace_id
        raw = json.dumps(body).encode()
    settings = state.settings()
    if preview:
        accepted: list[bool] = []
        run_command(_preview(settings, raw, allow_backorder, as_json, accepted), as_json)
        if accepted != [True]:
            sys.exit(EXIT_FAILURE)  # intake would refuse it (the preview says why)
    else:
        run_command(_submit(settings, raw, allow_backorder, as_json), as_json)


def _form_data(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except ValueError:
        raise click.BadParameter("not valid JSON", param_hint="--form-data") from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--form-data")
    return data


async def _submit(settings: Settings, raw: bytes, allow_backorder: bool, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        result = await operations.orders.submit_json(raw, allow_backorder=allow_backorder)
    if as_json:
        emit_json({"ok": True, "created": result.created, "order": result.order})
        return
    order_no = result.order["order_no"]
    echo(f"accepted order {order_no}" if result.created else f"order {order_no} was already accepted")
    print_order(result.order)


async def _preview(
    settings: Settings, raw: bytes, allow_backorder: bool, as_json: bool, accepted: list[bool]
) -> None:
    async with open_operations(settings) as operations:
        preview = await operations.orders.preview_json(raw, allow_backorder=allow_backorder)
    if as_json:
        emit_json({"ok": True, "preview": preview})
    else:
        print_preview(preview)
    accepted.append(preview["accepted"])


def print_preview(preview: Mapping[str, Any]) -> None:
    """What intake would do with an order: its answer, then each item (source, prices, stock, limit)."""
    answer = preview["answer"]
    order_no = preview["order_no"]
    if preview["repeat"]:
        echo(f"order {order_no} was already accepted with this body (a repeat answers it, 200)")
    elif preview["accepted"]:
        echo(f"order {order_no} would be accepted (202)")
    else:
        echo(f"order {order_no} would be refused: {answer['status']} {answer['error_code']}: "
             f"{answer['error_message']}")  # fmt: skip
    for item in preview["items"]:
        what = f"offer {item['offer']}" if item["offer"] else f"{item['upstream']} SKU {item['sku_id']}"
        if item["accepted"]:
            verdict = "bought" + (f" as {item['upstream']} SKU {item['sku_id']}" if item["offer"] else "")
        elif item["outcome"] == "exception":
            verdict = f"taken in as an exception {item['reason']}, not bought"
        else:
            verdict = f"refused {item['reason']}"
        echo()
        echo(f"item {item['position']}: {what} x{item['quantity']}: {verdict}")
        fields: list[tuple[str, Any]] = []
        if item["unit_price"] is not None:
            sells = f" (sells at {item['sell_price']} {item['sell_currency']})" if item["sell_price"] else ""
            fields.append(("unit price", f"{item['unit_price']}{sells}"))
            stock = item["stock"]
            fields.append(("stock", f"{stock['status']}, {stock['quantity']}"))
            fields.append(("price held", item["price_held"]))
        guard = f" (loss guard {item['loss_guard']})" if item["loss_guard"] else ""
        fields.append(("limit", f"{item['unit_limit'] or 'none'}{guard}"))
        for source in item.get("sources") or []:
            state = "in use" if source["in_use"] else "available" if source["available"] else source["reason"]
            fields.append(("source", f"{source['upstream']} SKU {source['sku_id']}: {state}"))
        if item["message"]:
            fields.append(("why", item["message"]))
        print_fields(fields)


@order_group.command("show")
@click.argument("order_no")
@click.option("--show-payload", is_flag=True, help="Also print delivered goods (card codes, accounts ...).")
@json_option
@common_options
@pass_state
def order_show(state: CliState, order_no: str, show_payload: bool, as_json: bool) -> None:
    """The order, each procurement, its fulfillment and the audit trail."""
    run_command(_show(state.settings(), order_no, show_payload, as_json), as_json)


async def _show(settings: Settings, order_no: str, show_payload: bool, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        order = await operations.orders.view(order_no)
        audit = await operations.orders.audit(order_no)
    shown = order if show_payload else hide_payloads(order)
    if as_json:
        emit_json({"ok": True, "order": shown, "audit": audit})
        return
    print_order(shown, show_payload=show_payload)
    echo()
    rows = [
        [utc(entry["at"]), entry["procurement_id"], entry["source"], _event(entry),
         f"{entry['old_state'] or '-'} -> {entry['new_state'] or '-'}"]
        for entry in audit
    ]  # fmt: skip
    columns = [Column("time (UTC)"), Column("procurement", right=True), Column("source"), Column("event"),
               Column("state")]  # fmt: skip
    print_table(columns, rows, notes=[entry["detail"] for entry in audit], title="audit trail")


def _event(entry: dict[str, Any]) -> str:
    """The entry's event, with how many identical ones it stands for (``late_status_ignored x300``)."""
    count = entry.get("count") or 1
    return entry["event"] if count == 1 else f"{entry['event']} x{count}"


@order_group.command("cancel")
@click.argument("order_no")
@json_option
@common_options
@pass_state
def order_cancel(state: CliState, order_no: str, as_json: bool) -> None:
    """Cancel the order upstream-first; refused (exit 1) when any item cannot be canceled."""
    run_command(_cancel(state.settings(secrets=True), order_no, as_json), as_json)


async def _cancel(settings: Settings, order_no: str, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        order = await operations.orders.cancel(order_no)
    if as_json:
        emit_json({"ok": True, "order": hide_payloads(order)})
        return
    echo(f"canceled order {order_no}")
    print_order(hide_payloads(order))
