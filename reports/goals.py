"""Goals (custom events) with their conversions and the revenue of the customers who
converted, and the realtime view of the last minutes. Pure shaping of counted rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal

from reports.money import exact_decimals, round_money
from reports.revenue import PaymentRow
from reports.segment_queries import SegmentCount
from reports.timeseries import ratio

MINUTE_MS = 60_000
REALTIME_MINUTES = 30
REALTIME_VISITOR_MINUTES = 5
REALTIME_TOP = 10


def goal_rows(counts: Iterable[SegmentCount], visitors: int,
              converted: Mapping[str, set[str]], payments: Iterable[PaymentRow],
              limit: int) -> list[dict]:
    """One row per custom event: `conversions` (its visitors, per day summed), `events`,
    `conversion_rate` (conversions / the range's visitors) and per currency the `net`
    revenue in the range of the customers who converted (a linked visitor id did the event
    in the range) and how many of them paid. Sorted by conversions, then name."""
    net: dict[str, dict[str, Decimal]] = {}
    with exact_decimals():
        for p in payments:
            sign = 1 if p.kind == "charge" else -1
            per_currency = net.setdefault(p.customer_id, {})
            per_currency[p.currency] = per_currency.get(p.currency, Decimal(0)) \
                + sign * p.amount * p.count
    rows = []
    for c in sorted(counts, key=lambda c: (-c.visitors, c.value or "")):
        if c.value is None:
            continue
        revenue: dict[str, dict] = {}
        with exact_decimals():
            for customer in sorted(converted.get(c.value, ())):
                for currency, amount in net.get(customer, {}).items():
                    entry = revenue.setdefault(currency, {"net": Decimal(0), "customers": 0})
                    entry["net"] += amount
                    entry["customers"] += 1
        rows.append({
            "name": c.value, "conversions": c.visitors, "events": c.events,
            "conversion_rate": ratio(c.visitors, visitors),
            "revenue": {currency: {"net": round_money(e["net"], currency),
                                   "customers": e["customers"]}
                        for currency, e in sorted(revenue.items())},
        })
    return rows[:limit]


def minute_label(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def realtime_view(now_ms: int, visitors: int, pageviews_by_minute: Mapping[int, int],
                  pages: Iterable[tuple[str, int, int]], sources: Iterable[tuple[str | None, int]],
                  max_delay_seconds: float) -> dict:
    """`visitors`: distinct visitor ids with an event in the last 5 minutes;
    `pageviews_per_minute`: the last 30 whole UTC minutes, the current one last (it is still
    filling); `top_pages` / `top_sources`: the 10 with most visitors over those minutes."""
    current = now_ms - now_ms % MINUTE_MS
    minutes = [current - k * MINUTE_MS for k in range(REALTIME_MINUTES - 1, -1, -1)]
    top_pages = sorted(pages, key=lambda p: (-p[1], -p[2], p[0]))[:REALTIME_TOP]
    top_sources = sorted(sources, key=lambda s: (-s[1], s[0] is None, s[0] or ""))[:REALTIME_TOP]
    return {
        "at": datetime.fromtimestamp(now_ms / 1000, UTC).isoformat().replace("+00:00", "Z"),
        "visitors": visitors,
        "pageviews_per_minute": [{"minute": minute_label(m),
                                  "pageviews": pageviews_by_minute.get(m // MINUTE_MS, 0)}
                                 for m in minutes],
        "top_pages": [{"page": p, "visitors": v, "pageviews": n} for p, v, n in top_pages],
        "top_sources": [{"source": s, "visitors": v} for s, v in top_sources],
        "max_delay_seconds": max_delay_seconds,
    }
