"""Flush threads of several hosts storing into one PostgreSQL (issue 29): one host's flush
thread against two, each host a process of its own with its own site (its own account),
as two gunicorn hosts behind one load balancer would write.

    .venv/bin/python -m bench.parallel_flush [--events N] [--postgres-url URL] [--one-site]

Each run gets a new database on the server; each process drains the same number of
prebuilt accepted events (bench.run.accepted_units) through ingest.flusher.Flusher with
its queue kept full. Reported: events/s over the wall time from the first event to the
last commit, for one host alone and for two at once (each with half the events, and with
the same number as the single host), and their ratio. The machine is shared: read the
ratios, measured in the same run, not the absolute figures. With --one-site the hosts
write one site (one account), as two workers behind one site's traffic: their flushes
take the site's lock in turn, and their visitors are the same, so sessions continue
across hosts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import sys
import time
from contextlib import ExitStack

import orjson

from bench.bodies import SITE_HOSTS
from bench.measure import open_target, postgres_database, table_count

POSTGRES_URL = (os.environ.get("TALLY_BENCH_DATABASE_URL")
                or "postgresql://postgres@127.0.0.1:5432/test")


def _site(target: str, name: str):
    from storage.directory import Directory

    db = open_target(target)
    try:
        directory = Directory(db, time.time)
        account = directory.create_account(name, "scale")
        site = directory.create_site(account["id"], list(SITE_HOSTS))
        return site["id"]
    finally:
        db.close()


def _host(target: str, site_id: str, events: int, start, done) -> None:
    """One host's flush thread draining `events` events of its site; puts (first event,
    last commit) perf_counter times and the flushes decided again on `done`."""
    from bench.run import accepted_units
    from config import Config
    from enrichment.enricher import Enricher
    from ingest.flusher import Flusher
    from ingest.queue import EventQueue
    from storage.directory import Directory

    config = Config.from_env()
    db = open_target(target)
    record = Directory(db, time.time).find_site(site_id)
    end_ms = int(time.time() * 1000)
    units = accepted_units(record, events, end_ms - 3_600_000, end_ms)
    queue = EventQueue(config.queue_max)
    flusher = Flusher(db, queue, Enricher(db, time.time, secrets.token_bytes),
                      interval=config.flush_interval)
    flusher.start()
    flusher.flush_now(timeout=120)
    start.wait()
    began = time.perf_counter()
    for unit in units:
        while not queue.offer(unit):
            time.sleep(0.0005)
    flusher.flush_now(timeout=600)
    ended = time.perf_counter()
    flusher.stop(timeout=60)
    db.close()
    done.put((began, ended, getattr(flusher.write, "decided_again", 0)))


def run(server_url: str, hosts: int, events_per_host: int, one_site: bool = False) -> dict:
    """`hosts` processes at once, each with its own site (or all with one); events/s over
    the wall time."""
    with ExitStack() as stack:
        target = stack.enter_context(postgres_database(server_url, "bench_parallel"))
        open_target(target).connect().close()  # the schema, once, before the hosts start
        sites = ([_site(target, "Hosts")] * hosts if one_site
                 else [_site(target, f"Host {n}") for n in range(hosts)])
        context = multiprocessing.get_context("fork")
        start, done = context.Event(), context.Queue()
        processes = [context.Process(target=_host, args=(target, site, events_per_host,
                                                         start, done)) for site in sites]
        for process in processes:
            process.start()
        start.set()
        spans = [done.get(timeout=1800) for _ in processes]
        for process in processes:
            process.join(60)
        stored = table_count(target, "events")
    seconds = max(end for _, end, _ in spans) - min(begin for begin, _, _ in spans)
    return {"hosts": hosts, "events": stored, "seconds": round(seconds, 2),
            "events_per_s": round(stored / seconds),
            # flushes decided before the lock whose reads had changed under it (none on
            # PostgreSQL, whose flush decides under its site locks)
            "decided_again": sum(again for _, _, again in spans)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000,
                        help="events one host stores (default 100,000)")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--one-site", action="store_true",
                        help="every host writes the same site")
    args = parser.parse_args(argv)
    one = run(args.postgres_url, 1, args.events)
    print(orjson.dumps(one).decode(), file=sys.stderr)
    two_halves = run(args.postgres_url, 2, args.events // 2, args.one_site)
    print(orjson.dumps(two_halves).decode(), file=sys.stderr)
    two_full = run(args.postgres_url, 2, args.events, args.one_site)
    print(orjson.dumps(two_full).decode(), file=sys.stderr)
    print(orjson.dumps({
        "one_host": one, "two_hosts_half_each": two_halves, "two_hosts_full_each": two_full,
        "two_over_one": round(two_full["events_per_s"] / one["events_per_s"], 2),
        "two_halves_over_one": round(two_halves["events_per_s"] / one["events_per_s"], 2),
    }, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
