"""The realtime view of the last minutes: visitors, pageviews per minute, top pages and
sources. Pure shaping of the counts read by reports.traffic.queries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

MINUTE_MS = 60_000
REALTIME_MINUTES = 30
REALTIME_VISITOR_MINUTES = 5
REALTIME_TOP = 10


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
