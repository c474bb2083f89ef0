"""First-touch attribution as the API shows it: one customer's, or every customer's channel.

The first-touch session itself is read by storage.sessions (customer_first_touch, kept
current by triggers in schema.sql), so reading it is a join, never a walk over links.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from storage.connection import Connection
from storage.sessions import first_channels, first_session
from vocabulary import UNATTRIBUTED, UTM_KEYS


def unattributed() -> dict:
    return {
        "channel": UNATTRIBUTED,
        "source": None,
        "referrer": None,
        "landing_page": None,
        "utm": {key.removeprefix("utm_"): None for key in UTM_KEYS},
        "first_seen": None,
    }


def customer_attribution(conn: Connection, site_id: int, customer_id: str) -> dict:
    """{"channel", "source", "referrer", "landing_page", "utm": {...}, "first_seen"}."""
    row = first_session(conn, site_id, customer_id)
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


def customer_channels(conn: Connection, site_id: int,
                      customer_ids: Iterable[str] | None = None) -> dict[str, str]:
    """customer id -> first-touch channel for the site's customers (or just those given).

    Customers without a linked session map to "Unattributed".
    """
    return {customer: channel or UNATTRIBUTED
            for customer, channel in first_channels(conn, site_id, customer_ids).items()}


def rfc3339_ms(ms: int) -> str:
    """Unix milliseconds as RFC 3339 UTC with milliseconds: 2026-09-21T14:13:20.000Z."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC) + timedelta(milliseconds=ms % 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
