"""Payments straight through storage.payments.PaymentStore on PostgreSQL, no HTTP.

    .venv/bin/python -m bench.postgres_payments [--url URL] [--payments 600] [--clients 1 8 32]
        [--writers 2 --modes shared exclusive --rounds 4]

Into a fresh database of the server at --url (default TALLY_BENCH_DATABASE_URL or the test
server), one site: for each number of clients, `--payments` upserts shared among that many
threads, each upserting one after another and giving its pooled connection back after each
(as a request does). Per round: payments/s, the p50/p99 of an upsert's wall time, the
CPU a payment cost the server (its backends for the bench database, /proc/<pid>/stat) and
this process, and the round trips a payment cost: the times the writer waited for the
server's results (a pipeline's sync or end), over the payments. Each payment has a customer (500 of them, so most upserts merge one) and a
subscription (300, so most refresh one). Compare two versions of the code back to back on
one machine; the server's CPU a payment is the figure load disturbs least.

`--writers 2` splits the clients over two PaymentStores (two payment writers on connections
of their own, as two workers have), and `--modes shared exclusive` runs each number of
clients once a mode, alternated `--rounds` times: `exclusive` takes the sites' locks
exclusively and no per-payment locks, as the writer did before payments of one site ran in
parallel (docs/perf-notes.md), so both are compared in one process on one machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Sequence

import psycopg

from bench.measure import DatabaseProbe, cpu_seconds, postgres_database
from config import Config
from storage.backend import open_database
from storage.directory import Directory
from storage.payments import PaymentStore
from validation.payment import validate_payment

DEFAULT_URL = os.environ.get("TALLY_BENCH_DATABASE_URL",
                             "postgresql://postgres@127.0.0.1:5432/test")


def payment(n: int):
    return validate_payment({
        "payment_id": f"pay_{n}", "customer": {"id": f"cus_{n % 500}", "email": "a@example.com"},
        "amount": 10, "currency": "USD", "kind": "charge", "paid_at": "2026-01-31T09:30:00Z",
        "subscription": {"id": f"sub_{n % 300}", "status": "active"}})


@contextlib.contextmanager
def counted_round_trips():
    """Counts the waits for the server's results in pipeline mode (every one of the payment
    writer's statements is pipelined): a sync, or the end of a pipeline, which syncs."""
    counted = [0]
    sync, leave = psycopg.Pipeline.sync, psycopg.Pipeline.__exit__

    def counted_sync(self):
        counted[0] += 1
        return sync(self)

    def counted_exit(self, *exc):
        counted[0] += self.level == 1
        return leave(self, *exc)

    psycopg.Pipeline.sync, psycopg.Pipeline.__exit__ = counted_sync, counted_exit
    try:
        yield counted
    finally:
        psycopg.Pipeline.sync, psycopg.Pipeline.__exit__ = sync, leave


@contextlib.contextmanager
def site_locks(mode: str):
    """`exclusive`: the payment writers' groups without their per-payment locks, so with
    their sites' locks exclusive (PostgresDatabase.grouped_transaction without lock_items)."""
    from storage.postgres import PostgresDatabase

    original = PostgresDatabase.grouped_transaction
    if mode == "exclusive":
        def grouped_transaction(self, *args, lock_items=None, **options):
            return original(self, *args, **options)

        PostgresDatabase.grouped_transaction = grouped_transaction
    try:
        yield
    finally:
        PostgresDatabase.grouped_transaction = original


def run_round(db, stores: list[PaymentStore], site_id: int, clients: int, payments: int,
              first: int, url: str) -> str:
    each = max(1, payments // clients)
    waits: list[list[float]] = [[] for _ in range(clients)]

    def upserts(k: int) -> None:
        for n in range(first + k * each, first + (k + 1) * each):
            started = time.perf_counter()
            stores[k % len(stores)].upsert(site_id, payment(n))
            db.release()
            waits[k].append(time.perf_counter() - started)

    threads = [threading.Thread(target=upserts, args=(k,)) for k in range(clients)]
    probe = DatabaseProbe(url).start()
    own_cpu = cpu_seconds(os.getpid())
    started = time.perf_counter()
    with counted_round_trips() as round_trips:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.perf_counter() - started
    own_cpu = cpu_seconds(os.getpid()) - own_cpu
    server_cpu = probe.finish()
    every = sorted(w for client in waits for w in client)
    done = len(every)
    return (f"{clients:>3} clients: {done / elapsed:7,.0f} payments/s,"
            f" p50 {every[done // 2] * 1000:6.2f} ms, p99 {every[int(done * 0.99)] * 1000:6.2f} ms,"
            f" server CPU {server_cpu / done * 1e6:6,.0f} us/payment,"
            f" bench process CPU {own_cpu / done * 1e6:6,.0f} us/payment,"
            f" round trips {round_trips[0] / done:4.2f}/payment")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.postgres_payments",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--payments", type=int, default=600, help="upserts a round")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32],
                        help="a round for each: threads upserting at once")
    parser.add_argument("--writers", type=int, default=1,
                        help="payment writers the clients are spread over (one a worker)")
    parser.add_argument("--modes", nargs="+", choices=("shared", "exclusive"),
                        default=["shared"], help="the sites' locks of the payment writers")
    parser.add_argument("--rounds", type=int, default=1, help="times each mode runs")
    args = parser.parse_args(argv)
    with postgres_database(args.url, "bench_payments") as url:
        db = open_database(Config(database_url=url))
        stores: list[PaymentStore] = []
        try:
            directory = Directory(db, time.time)
            account = directory.create_account("Bench", "scale")
            site = directory.find_site(directory.create_site(account["id"], ["a.example"])["id"])
            db.release()
            stores = [PaymentStore(db, time.time) for _ in range(args.writers)]
            first = 0
            for round_ in range(args.rounds):
                for mode in args.modes:
                    for clients in args.clients:
                        with site_locks(mode):
                            line = run_round(db, stores, site.id, clients, args.payments,
                                             first, url)
                        print(f"round {round_ + 1} {mode:>9}: {line}", flush=True)
                        first += args.payments
        finally:
            for store in stores:
                store.stop()
            db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
