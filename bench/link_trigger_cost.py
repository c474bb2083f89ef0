"""What the first-touch trigger on session_visitors costs the flush's INSERT of a batch's
links, on PostgreSQL (issue 29).

    python -m bench.link_trigger_cost [--stored 200000] [--links 10000] [--rounds 5]
                                      [--customers 0] [--server URL]

In a new database with Tally's schema, one site with `--stored` links already (random
visitor ids, as visitor hashes are) and `--customers` customers (half linked by visitor
id, half by user id through an identity), inserts `--links` new links with the flush's
own statement (storage.sessions link_session_visitors) in a transaction that is rolled
back, alternately with the statement-level trigger on and with it off
(session_replication_role = replica, a superuser's setting: measurement only). Prints
each round's wall time and the backend's CPU (its /proc stat) in us a link.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import ExitStack

_USER = "SELECT pg_backend_pid()"


def _cpu(pid: int) -> float:
    from bench.measure import cpu_seconds

    return cpu_seconds(pid) or 0.0


def main() -> None:
    from bench.measure import postgres_database
    from config import Config
    from storage.backend import open_database
    from storage.directory import Directory
    from storage.sessions import link_session_visitors

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stored", type=int, default=200_000)
    parser.add_argument("--links", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--customers", type=int, default=0)
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    rng = random.Random(29)
    with ExitStack() as stack:
        url = stack.enter_context(postgres_database(args.server, "bench_links"))
        db = open_database(Config(database_url=url))
        stack.callback(db.close)
        directory = Directory(db, time.time)
        account = directory.create_account("Bench", "scale")
        site = directory.find_site(directory.create_site(account["id"], ["a.test"])["id"]).id
        conn = db.connect()
        visitor = lambda: rng.randrange(1, 1 << 62)  # noqa: E731
        with db.transaction(conn, sites=[site]):
            link_session_visitors(conn, [(site, visitor(), n + 1) for n in range(args.stored)])
            for n in range(args.customers):
                user = f"user-{n}"
                linked = visitor()
                if n % 2:
                    conn.execute("INSERT INTO customers (site_id, customer_id, visitor_id,"
                                 " as_of_ms, created_at, updated_at) VALUES (?, ?, ?, 0, 0, 0)",
                                 (site, f"cus_{n}", str(linked)))
                else:
                    conn.execute("INSERT INTO customers (site_id, customer_id, user_id,"
                                 " as_of_ms, created_at, updated_at) VALUES (?, ?, ?, 0, 0, 0)",
                                 (site, f"cus_{n}", user))
                    conn.execute("INSERT INTO visitor_identities (site_id, uid, visitor_id,"
                                 " linked_at) VALUES (?, ?, ?, 0)", (site, user, linked))
        conn.raw.execute("ANALYZE")
        pid = conn.raw.execute(_USER).fetchone()[0]
        figures = {"on": [], "off": []}
        for _ in range(args.rounds):
            for trigger in ("on", "off"):
                links = [(site, visitor(), args.stored + n + 1) for n in range(args.links)]
                conn.raw.execute("BEGIN")
                if trigger == "off":
                    conn.raw.execute("SET LOCAL session_replication_role = replica")
                cpu, wall = _cpu(pid), time.perf_counter()
                link_session_visitors(conn, links)
                wall, cpu = time.perf_counter() - wall, _cpu(pid) - cpu
                conn.raw.execute("ROLLBACK")
                figures[trigger].append((wall * 1e6 / args.links, cpu * 1e6 / args.links))
                print(f"trigger {trigger}: {wall * 1e6 / args.links:.2f} us a link wall,"
                      f" {cpu * 1e6 / args.links:.2f} server CPU")
        conn.close()
        for trigger, rows in figures.items():
            print(f"median, trigger {trigger}: wall {statistics.median(r[0] for r in rows):.2f},"
                  f" server CPU {statistics.median(r[1] for r in rows):.2f} us a link")


if __name__ == "__main__":
    main()
