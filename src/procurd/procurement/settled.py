"""The numbers whose procurement is settled: a repeated callback about them is answered from memory.

Upstreams send a callback again until it is answered, and a delivered order's callback often more than
once. A number whose procurement is delivered and agrees with what the upstream says (the same order, in the
same status) needs nothing written for a repeat of that report, so the service answers it ``duplicate``
without touching the database. Any change of the procurement forgets its numbers.
"""

from __future__ import annotations

from collections import OrderedDict

from procurd.core.procurement import Procurement, State, UpstreamReport

SETTLED_CACHE_SIZE = 10_000


class SettledNumbers:
    """The last :data:`SETTLED_CACHE_SIZE` settled numbers, by upstream and number, with the upstream's
    order id and status."""

    def __init__(self, size: int = SETTLED_CACHE_SIZE) -> None:
        self._size = size
        self._known: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()

    def repeats(self, upstream: str, number: str, report: UpstreamReport) -> bool:
        """Whether ``report`` says again what the settled procurement under ``number`` holds."""
        key = (upstream, number)
        if self._known.get(key) != (report.order_id, report.status):
            return False
        self._known.move_to_end(key)
        return True

    def remember(self, upstream: str, number: str, report: UpstreamReport, p: Procurement) -> None:
        """Keep ``number`` when ``p``, as ``report`` left it, is delivered and agrees with the report."""
        if (
            p.state is State.DELIVERED
            and p.downstream_order_no == number
            and p.upstream_status == report.status
            and p.upstream_order_id == report.order_id
        ):
            self._known[(upstream, number)] = (report.order_id, report.status)
            if len(self._known) > self._size:
                self._known.popitem(last=False)

    def forget(self, p: Procurement) -> None:
        """``p`` changed: what was known of its numbers no longer holds."""
        for number in p.downstream_order_nos:
            self._known.pop((p.upstream, number), None)
