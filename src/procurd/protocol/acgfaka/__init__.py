"""acg-faka's shared-shop ("对接") API, the client side: procurd buying from an acg-faka shop.

Pure where it can be: :mod:`.signing` (the signature and the form body), :mod:`.envelope` (answers and
lenient exact values), :mod:`.refusals` (refusal texts and what each proves about a trade), :mod:`.ini` (the
commodity config), :mod:`.widgets` (buyer inputs), :mod:`.goods` (commodities as seed 000 products and SKUs),
:mod:`.orders` (request numbers, trades, deliveries). :mod:`.client` talks to one supplier over HTTP.
"""

from procurd.protocol.acgfaka.client import AcgFakaClient, Connected, EndpointAbsent, Features
from procurd.protocol.acgfaka.envelope import StockReading, read_envelope, read_stock
from procurd.protocol.acgfaka.goods import (
    Choice,
    Commodity,
    Goods,
    GoodsError,
    Listing,
    PriceSource,
    Problem,
    choice_key,
    fallback_unit_cost,
    goods_of,
    read_commodity,
    read_listing,
)
from procurd.protocol.acgfaka.orders import (
    Delivery,
    QueryResult,
    TradeRequest,
    TradeResult,
    delivered_later,
    interpret_delivery,
    request_no,
)
from procurd.protocol.acgfaka.refusals import classify_refusal, classify_trade_refusal
from procurd.protocol.acgfaka.signing import form_body, sign, signing_string

__all__ = [
    "AcgFakaClient",
    "Choice",
    "Commodity",
    "Connected",
    "Delivery",
    "EndpointAbsent",
    "Features",
    "Goods",
    "GoodsError",
    "Listing",
    "PriceSource",
    "Problem",
    "QueryResult",
    "StockReading",
    "TradeRequest",
    "TradeResult",
    "choice_key",
    "classify_refusal",
    "classify_trade_refusal",
    "delivered_later",
    "fallback_unit_cost",
    "form_body",
    "goods_of",
    "interpret_delivery",
    "read_commodity",
    "read_envelope",
    "read_listing",
    "read_stock",
    "request_no",
    "sign",
    "signing_string",
]
