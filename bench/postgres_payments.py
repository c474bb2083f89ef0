"""Payments straight through storage.payments.PaymentStore on PostgreSQL, no HTTP.

    .venv/bin/python -m bench.postgres_payments [--url URL] [--payments 600] [--threads 6]

Into a fresh database of the server at --url (default TALLY_BENCH_DATABASE_URL or the test
server), one site: `--payments` upserts one after another (payments/s and the p50/p99 of
each upsert's wall time), then as many again from `--threads` threads at once. Each
payment has a customer (500 of them, so most upserts merge one) and a subscription (300,
so most refresh one). Compare two versions of the code back to back on one machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence

from bench.measure import postgres_database
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.postgres_payments",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--payments", type=int, default=600)
    parser.add_argument("--threads", type=int, default=6,
                        help="at most the pool's connections less one")
    args = parser.parse_args(argv)
    with postgres_database(args.url, "bench_payments") as url:
        db = open_database(Config(database_url=url))
        try:
            directory = Directory(db, time.time)
            account = directory.create_account("Bench", "scale")
            site = directory.find_site(directory.create_site(account["id"], ["a.example"])["id"])
            store = PaymentStore(db, time.time)
            waits = []
            for n in range(args.payments):
                started = time.perf_counter()
                store.upsert(site.id, payment(n))
                waits.append(time.perf_counter() - started)
            db.release()
            waits.sort()
            print(f"one after another: {len(waits) / sum(waits):,.0f} payments/s, "
                  f"p50 {waits[len(waits) // 2] * 1000:.2f} ms, "
                  f"p99 {waits[int(len(waits) * 0.99)] * 1000:.2f} ms")
            each = max(1, args.payments // args.threads)

            def upserts(first: int) -> None:
                for n in range(first, first + each):
                    store.upsert(site.id, payment(n))
                db.release()

            threads = [threading.Thread(target=upserts, args=(args.payments + k * each,))
                       for k in range(args.threads)]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print(f"{args.threads} threads at once: "
                  f"{each * args.threads / (time.perf_counter() - started):,.0f} payments/s")
        finally:
            db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
