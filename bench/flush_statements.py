"""Each statement of the PostgreSQL flush timed from the flush thread (issue 29).

    python -m bench.flush_statements --events 100000 [--server URL]

Runs `bench.run.flusher_drain` (the flush thread alone, its queue kept full) into a new
database and times, in the flush thread only, every statement it sends (wall time: the
server's work plus the round trip, and the thread's own CPU inside the call), the
enrichment, the decisions and the whole transaction. Printed in us an event; the drain's
own figures (events/s, the thread's and the server's CPU an event) follow. The timing
itself costs the thread about 1 us a statement.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager

import orjson

TIMES: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # label -> [n, wall, cpu]
_depth = threading.local()
_counted: list[int] = []  # the first Flusher's thread: the enrich-only drain's is not timed


def _counting() -> bool:
    return bool(_counted) and threading.get_ident() == _counted[0]

_LABELS = [
    (r"^COPY \"?sessions", "COPY sessions"),
    (r"^COPY \"?events", "COPY events"),
    (r"^WITH sequence AS .* SELECT ARRAY\(SELECT id FROM sites", "sites stored + new sessions' ids"),
    (r"^WITH sequence AS", "new sessions' ids (nextval)"),
    (r"^SELECT o\.id, o\.started_at", "stored sessions of the visitors"),
    (r"^INSERT INTO session_visitors", "INSERT session_visitors (unnest)"),
    (r"^UPDATE sessions SET last_seen_at", "UPDATE session counts (unnest)"),
    (r"^UPDATE sessions SET started_at", "UPDATE session landings"),
    (r"^INSERT INTO visitor_identities", "INSERT visitor_identities (unnest)"),
    (r"^INSERT INTO monthly_usage", "monthly_usage upsert"),
    (r"^SELECT id FROM sites", "sites stored (check)"),
    (r"^SELECT salt FROM visitor_salts", "visitor salt"),
    (r"^SELECT day, salt FROM visitor_salts", "previous days' visitor salts"),
    (r"^SELECT .*FROM sites", "site hosts"),
    (r"^COMMIT", "COMMIT"),
]


def _label(sql) -> str:
    text = " ".join(str(sql).split())
    for pattern, name in _LABELS:
        if re.search(pattern, text):
            return name
    return text[:60]


def _timed(label_of, function):
    def timed(*args, **kwargs):
        if not _counting() or getattr(_depth, "n", 0):
            return function(*args, **kwargs)
        _depth.n = 1
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            entry = TIMES[label_of(*args, **kwargs)]
            entry[0] += 1
            entry[1] += time.perf_counter() - wall
            entry[2] += time.thread_time() - cpu
            _depth.n = 0
    return timed


def _phase(name, function):
    def timed(*args, **kwargs):
        if not _counting():
            return function(*args, **kwargs)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            entry = TIMES["phase: " + name]
            entry[0] += 1
            entry[1] += time.perf_counter() - wall
            entry[2] += time.thread_time() - cpu
    return timed


def install() -> None:
    import ingest.flusher
    from attribution.sessions import SessionWriter
    from storage.postgres import PostgresConnection

    pc = PostgresConnection
    pc.execute = _timed(lambda self, sql, params=(): _label(sql), pc.execute)
    pc.executemany = _timed(lambda self, sql, rows: _label(sql) + " (executemany)",
                            pc.executemany)
    pc.copy_rows = _timed(lambda self, table, columns, rows: f"COPY {table}", pc.copy_rows)
    pc.commit = _timed(lambda self: "COMMIT", pc.commit)
    pc.begin_sites = _timed(lambda self, sites: "BEGIN + locks", pc.begin_sites)
    pipeline = pc.pipeline

    @contextmanager
    def timed_pipeline(self):
        # The statements inside are timed as they are sent; this is the block as a whole,
        # their server time and the round trip that reads them back among it.
        if not _counting():
            with pipeline(self):
                yield self
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            with pipeline(self):
                yield self
        finally:
            entry = TIMES["pipeline (what is sent in it, read back once)"]
            entry[0] += 1
            entry[1] += time.perf_counter() - wall
            entry[2] += time.thread_time() - cpu

    if hasattr(pc, "pipeline"):
        pc.pipeline = timed_pipeline
    start = ingest.flusher.Flusher.start

    def started(self):
        start(self)
        if not _counted:
            _counted.append(self._thread.ident)

    ingest.flusher.Flusher.start = started
    ingest.flusher.enrich = _phase("enrich", ingest.flusher.enrich)
    SessionWriter.decide = _phase("decide sessions (with its reads)", SessionWriter.decide)
    ingest.flusher.Flusher._commit = _phase("transaction (BEGIN to COMMIT)",
                                            ingest.flusher.Flusher._commit)
    ingest.flusher.Flusher._write = _phase("flush (enrich to COMMIT)", ingest.flusher.Flusher._write)


def main() -> None:
    from bench.measure import postgres_database
    from bench.run import flusher_drain

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    install()
    with ExitStack() as stack:
        target = stack.enter_context(postgres_database(args.server, "bench_statements"))
        result = flusher_drain(target, args.events)
    events = result["events"]
    # The enrich-only drain ran after: its phases are not the flush's.
    print(f"{'statement or phase':<42} {'calls':>6} {'wall us/ev':>10} {'cpu us/ev':>10}")
    rows = {}
    for label, (n, wall, cpu) in sorted(TIMES.items(), key=lambda item: -item[1][1]):
        rows[label] = {"calls": n, "wall_us": round(wall * 1e6 / events, 2),
                       "cpu_us": round(cpu * 1e6 / events, 2)}
        print(f"{label:<42} {n:>6} {wall * 1e6 / events:>10.2f} {cpu * 1e6 / events:>10.2f}")
    summary = {key: result[key] for key in ("events", "events_per_s", "cpu_us_per_event",
                                             "database_cpu_us_per_event") if key in result}
    print(summary)
    if args.json:
        with open(args.json, "wb") as out:
            out.write(orjson.dumps({"statements": rows, "drain": summary}))


if __name__ == "__main__":
    main()
