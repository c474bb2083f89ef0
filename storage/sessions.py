"""Sessions, the visitor ids they were seen under, identity links and first touches.

`customer_first_touch` names each customer's first-touch session and is kept current by
triggers (schema.sql). Every reader of a customer's first touch goes through
`first_touch_join`, so what "first touch" means is written once.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable

from vocabulary import UTM_KEYS

_ALIAS = re.compile(r"[a-z][a-z0-9_]*")


def first_touch_join(owner: str, session: str = "fs") -> str:
    """SQL to append after `FROM <table> <owner>` (a table with site_id and customer_id):
    LEFT JOINs each row to its customer's first-touch session, aliased `session`, whose
    columns are all NULL when the customer has none."""
    if not (_ALIAS.fullmatch(owner) and _ALIAS.fullmatch(session)):
        raise ValueError(f"not an alias: {owner!r}, {session!r}")
    link = f"{session}_link"
    return (
        # sql-safe: owner and session are aliases checked against _ALIAS, written by callers
        f" LEFT JOIN customer_first_touch {link} ON {link}.site_id = {owner}.site_id"
        f" AND {link}.customer_id = {owner}.customer_id"
        f" LEFT JOIN sessions {session} ON {session}.id = {link}.session_id"
    )


_FIRST_SESSION = (
    "SELECT fs.id, fs.channel, fs.source, fs.referrer, fs.landing_page, "  # noqa: S608 - fixed names
    + ", ".join(f"fs.{key}" for key in UTM_KEYS) + ", fs.started_at"  # sql-safe: fixed UTM_KEYS
    + " FROM (SELECT ?1 AS site_id, ?2 AS customer_id) AS owner"
    + first_touch_join("owner")  # sql-safe: a fixed alias
)
_FIRST_CHANNEL = (
    "SELECT fs.channel FROM (SELECT ?1 AS site_id, ?2 AS customer_id) AS owner"  # noqa: S608 - fixed alias
    + first_touch_join("owner")  # sql-safe: a fixed alias
)
_FIRST_CHANNELS = (
    "SELECT owner.customer_id, fs.channel FROM customer_first_touch owner"  # noqa: S608 - fixed alias
    + first_touch_join("owner")  # sql-safe: a fixed alias
    + " WHERE owner.site_id = ?"
)


def first_session(conn: sqlite3.Connection, site_id: int, customer_id: str) -> tuple | None:
    """(channel, source, referrer, landing_page, *utm values, started_at) of the customer's
    first-touch session, or None."""
    row = conn.execute(_FIRST_SESSION, (site_id, customer_id)).fetchone()
    return None if row[0] is None else row[1:]


def first_channels(conn: sqlite3.Connection, site_id: int,
                   customer_ids: Iterable[str] | None = None) -> dict[str, str | None]:
    """customer id -> first-touch channel of every customer with a first-touch row (or of
    those given: None where there is no session)."""
    if customer_ids is None:
        return dict(conn.execute(_FIRST_CHANNELS, (site_id,)).fetchall())
    return {customer: conn.execute(_FIRST_CHANNEL, (site_id, customer)).fetchone()[0]
            for customer in dict.fromkeys(customer_ids)}
