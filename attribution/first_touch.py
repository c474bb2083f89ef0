"""Reading first-touch attribution: one customer's, or every customer's channel at once.

customer_first_touch is kept current by triggers (schema.sql, issue 6 section), so
reading it is a join, never a walk over links.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from attribution.channels import UNATTRIBUTED
from attribution.sessions import UTM_KEYS

_FIRST_SESSION = (
    "SELECT s.channel, s.source, s.referrer, s.landing_page, s.utm_source, s.utm_medium,"
    " s.utm_campaign, s.utm_term, s.utm_content, s.started_at"
    " FROM customer_first_touch ft JOIN sessions s ON s.id = ft.session_id"
    " WHERE ft.site_id = ? AND ft.customer_id = ?"
)


def unattributed() -> dict:
    return {
        "channel": UNATTRIBUTED,
        "source": None,
        "referrer": None,
        "landing_page": None,
        "utm": {key.removeprefix("utm_"): None for key in UTM_KEYS},
        "first_seen": None,
    }


def customer_attribution(conn: sqlite3.Connection, site_id: int, customer_id: str) -> dict:
    """{"channel", "source", "referrer", "landing_page", "utm": {...}, "first_seen"}."""
    row = conn.execute(_FIRST_SESSION, (site_id, customer_id)).fetchone()
    if row is None:
        return unattributed()
    channel, source, referrer, landing_page, *utm, started_at = row
    return {
        "channel": channel,
        "source": source,
        "referrer": referrer,
        "landing_page": landing_page,
        "utm": {key.removeprefix("utm_"): value for key, value in zip(UTM_KEYS, utm, strict=True)},
        "first_seen": rfc3339_ms(started_at),
    }


def customer_channels(conn: sqlite3.Connection, site_id: int,
                      customer_ids: Iterable[str] | None = None) -> dict[str, str]:
    """customer id -> first-touch channel for the site's customers (or just those given).

    Customers without a linked session map to "Unattributed".
    """
    if customer_ids is None:
        rows = conn.execute(
            "SELECT ft.customer_id, s.channel FROM customer_first_touch ft"
            " LEFT JOIN sessions s ON s.id = ft.session_id WHERE ft.site_id = ?",
            (site_id,),
        )
        return {customer: channel or UNATTRIBUTED for customer, channel in rows}
    channels = {}
    for customer in dict.fromkeys(customer_ids):
        row = conn.execute(
            "SELECT s.channel FROM customer_first_touch ft JOIN sessions s ON s.id = ft.session_id"
            " WHERE ft.site_id = ? AND ft.customer_id = ?",
            (site_id, customer),
        ).fetchone()
        channels[customer] = row[0] if row else UNATTRIBUTED
    return channels


def rfc3339_ms(ms: int) -> str:
    """Unix milliseconds as RFC 3339 UTC with milliseconds: 2026-09-21T14:13:20.000Z."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
