"""The few fragments SQLite and PostgreSQL spell differently, by dialect name.

Storage's statements are otherwise written once, in the subset both share (the
PostgreSQL connection respells placeholders and a handful of functions: storage/postgres.py).
"""

from __future__ import annotations

from contextlib import nullcontext


def dialect(conn) -> str:
    """"postgres" or "sqlite" (a plain sqlite3 connection has no dialect attribute)."""
    return getattr(conn, "dialect", "sqlite")


_AS_THEY_ARE = nullcontext()


def pipelined(conn):
    """On PostgreSQL the block's statements go out without waiting for one another: those
    whose rows nobody reads cost one round trip together, paid when the block ends or a
    later statement's rows are read (PostgresConnection.pipeline); an error of any of them
    is raised there. On SQLite, and inside a pipeline already, they run as they are."""
    if dialect(conn) == "postgres" and conn.pipelined is None:
        return conn.pipeline()
    return _AS_THEY_ARE


# The UTC month ("YYYY-MM") of a unix-ms column, and the ms its month starts and ends at.
_MONTH = {
    "sqlite": ("strftime('%Y-%m', {ts} / 1000, 'unixepoch')",
               "unixepoch({ts} / 1000, 'unixepoch', 'start of month') * 1000",
               "unixepoch({ts} / 1000, 'unixepoch', 'start of month', '+1 month') * 1000"),
    "postgres": ("to_char(to_timestamp({ts} / 1000) AT TIME ZONE 'UTC', 'YYYY-MM')",
                 "(extract(epoch FROM date_trunc('month', to_timestamp({ts} / 1000)"
                 " AT TIME ZONE 'UTC'))::bigint * 1000)",
                 "(extract(epoch FROM date_trunc('month', to_timestamp({ts} / 1000)"
                 " AT TIME ZONE 'UTC') + interval '1 month')::bigint * 1000)"),
}


def counted_by_month(name: str, ts: str = "e.ts") -> str:
    """`month, count(*), early, late` of the events `ts` belongs to, for a GROUP BY month:
    early within ? ms after the month's start, late within ? ms before its end."""
    month, start, end = (part.format(ts=ts) for part in _MONTH[name])
    return (f"{month} AS month, count(*),"
            f" count(*) FILTER (WHERE {ts} < {start} + ?),"
            f" count(*) FILTER (WHERE {ts} >= {end} - ?)")


# SQLite's CAST(text AS INTEGER): the integer that leading blanks, a sign and digits spell,
# clamped to 64 bits; 0 when there are none. PostgreSQL's CAST refuses such text instead.
_INTEGER_OF_TEXT = {
    "sqlite": "CAST({text} AS INTEGER)",
    "postgres": "CAST(LEAST(GREATEST(coalesce(CAST(substring({text}"
                " FROM '^[ \\t\\n\\v\\f\\r]*([+-]?[0-9]+)') AS NUMERIC), 0),"
                " -9223372036854775808), 9223372036854775807) AS BIGINT)",
}


def integer_of_text(name: str, text: str) -> str:
    """The integer SQLite's CAST(`text` AS INTEGER) gives, in dialect `name`."""
    return _INTEGER_OF_TEXT[name].format(text=text)
