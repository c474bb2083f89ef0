"""The flush's events write on PostgreSQL, three ways, at the flush's transaction size.

    .venv/bin/python -m bench.postgres_insert [--url URL] [--events 100000]
                                              [--transaction 5000] [--runs 3]

Rows are the real enrich step's (bench.run.accepted_units through enrichment.Enricher:
50-event batches with referrers, UTM tags and a `$identify` each), with a session id each,
written into a fresh database of the server at --url (default TALLY_BENCH_DATABASE_URL or
the test server), each transaction as the flush makes it: BEGIN, the writer lock, the
rows, COMMIT. The ways:
- executemany: storage.sparse.SparseInsert's SQLite path, an executemany per run of rows
  setting the same columns (psycopg 3 sends an executemany as one pipeline);
- multi-row INSERT: every column, MULTIROW_ROWS rows a statement;
- COPY: `COPY events (...) FROM STDIN`, the rows in psycopg's text format, what storage
  does on PostgreSQL (storage.postgres.PostgresConnection.copy_rows).
Each round truncates the table before each way and takes the ways in a rotated order;
the figures are the medians over the rounds: rows/s (wall), and the CPU per row of this
process (Python and libpq) and of the server's backend process (/proc, when readable).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from bench.measure import cpu_seconds, postgres_database
from storage.events import EVENT_COLUMNS, insert_events
from storage.postgres import PostgresConnection, PostgresDatabase
from storage.sparse import SparseInsert

DEFAULT_URL = os.environ.get("TALLY_BENCH_DATABASE_URL",
                             "postgresql://postgres@127.0.0.1:5432/test")
MULTIROW_ROWS = 1_000  # 29 parameters a row: well under PostgreSQL's 65,535 a statement
_COLUMNS = ", ".join(EVENT_COLUMNS)


class _ExecutemanyOnly:
    """The connection as SparseInsert's executemany path sees it (its dialect unknown)."""

    def __init__(self, conn: PostgresConnection):
        self.executemany = conn.executemany


def write_executemany(conn: PostgresConnection, rows: Sequence[tuple]) -> None:
    SparseInsert("events", EVENT_COLUMNS).write(_ExecutemanyOnly(conn), rows)


def write_multirow(conn: PostgresConnection, rows: Sequence[tuple]) -> None:
    row_marks = "(" + ", ".join(["%s"] * len(EVENT_COLUMNS)) + ")"
    for start in range(0, len(rows), MULTIROW_ROWS):
        chunk = rows[start:start + MULTIROW_ROWS]
        sql = f"INSERT INTO events ({_COLUMNS}) VALUES " + ", ".join([row_marks] * len(chunk))  # noqa: S608 - fixed columns
        conn.raw.execute(sql, [value for row in chunk for value in row])


def write_copy(conn: PostgresConnection, rows: Sequence[tuple]) -> None:
    with conn.raw.cursor().copy(f"COPY events ({_COLUMNS}) FROM STDIN") as copy:  # noqa: S608 - fixed columns
        for row in rows:
            copy.write_row(row)


def write_storage(conn: PostgresConnection, rows: Sequence[tuple]) -> None:
    """What storage.events.insert_events does on PostgreSQL."""
    insert_events(conn, [row[:-1] for row in rows], [row[-1] for row in rows])


WAYS: dict[str, Callable[[PostgresConnection, Sequence[tuple]], None]] = {
    "executemany": write_executemany,
    "multi-row INSERT": write_multirow,
    "COPY": write_copy,
    "storage.events.insert_events": write_storage,
}


def event_rows(db: PostgresDatabase, events: int) -> list[tuple]:
    """`events` rows in EVENT_COLUMNS order, made by the real enrich step."""
    from bench.run import accepted_units
    from enrichment.enricher import Enricher
    from storage.directory import Directory

    directory = Directory(db, time.time)
    account = directory.create_account("Bench", "scale")
    site = directory.create_site(account["id"], ["example.com", "www.example.com"])
    record = directory.find_site(site["id"])
    end_ms = int(time.time() * 1000)
    units = accepted_units(record, events, end_ms - 86_400_000, end_ms)
    batch = Enricher(db, time.time, secrets.token_bytes).build(db.conn(), units)
    # A session per visitor as the flush assigns them (identifies have none).
    sessions: dict = {}
    rows = []
    for row in batch.rows[:events]:
        session = None if row.name == "$identify" else sessions.setdefault(
            row.visitor_id, len(sessions) + 1)
        rows.append((*row, session))
    return rows


def measure(db: PostgresDatabase, rows: list[tuple], transaction: int, runs: int,
            ways: Sequence[str]) -> dict:
    conn = db.connect()
    backend_pid = conn.raw.execute("SELECT pg_backend_pid()").fetchone()[0]
    samples: dict[str, list[tuple[float, float, float | None]]] = {way: [] for way in ways}
    try:
        for run in range(runs):
            for way in ways[run % len(ways):] + ways[:run % len(ways)]:
                conn.raw.execute("TRUNCATE events")
                conn.raw.execute("CHECKPOINT")
                write = WAYS[way]
                server_before = cpu_seconds(backend_pid)
                cpu_before, started = time.process_time(), time.perf_counter()
                for start in range(0, len(rows), transaction):
                    conn.execute("BEGIN IMMEDIATE")
                    write(conn, rows[start:start + transaction])
                    conn.commit()
                seconds = time.perf_counter() - started
                client_cpu = time.process_time() - cpu_before
                server_after = cpu_seconds(backend_pid)
                server_cpu = (None if server_before is None or server_after is None
                              else server_after - server_before)
                stored = conn.raw.execute("SELECT count(*) FROM events").fetchone()[0]
                if stored != len(rows):
                    raise RuntimeError(f"{way} stored {stored} of {len(rows)} rows")
                samples[way].append((seconds, client_cpu, server_cpu))
    finally:
        conn.close()
    out = {}
    for way, taken in samples.items():
        seconds = statistics.median(s[0] for s in taken)
        server = [s[2] for s in taken if s[2] is not None]
        out[way] = {
            "rows_per_s": round(len(rows) / seconds),
            "client_cpu_us_per_row": round(
                statistics.median(s[1] for s in taken) * 1e6 / len(rows), 2),
            "server_cpu_us_per_row": round(statistics.median(server) * 1e6 / len(rows), 2)
            if server else None,
            "runs_s": [round(s[0], 3) for s in taken],
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.postgres_insert",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--transaction", type=int, default=5_000,
                        help="rows per transaction (the flush's under load: TALLY_QUEUE_MAX / 2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ways", nargs="+", choices=list(WAYS),
                        default=["executemany", "multi-row INSERT", "COPY"])
    args = parser.parse_args(argv)
    with postgres_database(args.url, "bench_insert") as url:
        db = PostgresDatabase(url)
        try:
            rows = event_rows(db, args.events)
            figures = measure(db, rows, args.transaction, args.runs, args.ways)
        finally:
            db.close()
    print(f"{len(rows):,} events, {args.transaction:,}-row transactions, "
          f"median of {args.runs} runs")
    for way, f in figures.items():
        server = "-" if f["server_cpu_us_per_row"] is None else f"{f['server_cpu_us_per_row']:.2f}"
        print(f"  {way:30} {f['rows_per_s']:>9,} rows/s   client CPU "
              f"{f['client_cpu_us_per_row']:6.2f} us/row   server CPU {server} us/row   "
              f"runs {f['runs_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
