"""CPU of the request path of one single event, in-process (no gunicorn, no wrk).

    .venv/bin/python -m bench.request_cost [--requests 2000] [--runs 5] [--batches]

Makes the app on a fresh SQLite file (prometheus-client's multiprocess folder set, as
under gunicorn), a site and an events key, then POSTs one ~400-byte pageview through
falcon.testing, `--runs` times `--requests` requests, and prints the request thread's CPU
(time.thread_time) per request of each run; the flush thread stores the events meanwhile
and is not counted. falcon.testing's own work is included, so compare trees, not with
the bench's per-request figures. With --batches it POSTs `make bench`'s 50-event batch
bodies in turn instead and prints the CPU per event.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import orjson

CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
          " Chrome/120.0.0.0 Safari/537.36")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench.request_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", action="store_true",
                        help="make bench's 50-event batch bodies; CPU per event")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tally-request-") as folder:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        from falcon import testing

        from app import create_app
        from bench.bodies import BATCH_SIZE, batch_bodies
        from config import Config

        tally = create_app(Config(db_path=os.path.join(folder, "t.db"), queue_max=10_000_000))
        try:
            account = tally.directory.create_account("Bench", "scale")
            site = tally.directory.create_site(account["id"], ["example.com"])
            key = tally.directory.create_key(site["id"], ["events"])["key"]
            client = testing.TestClient(tally.wsgi)
            body = orjson.dumps({"s": site["id"], "e": "pageview",
                                 "u": "https://example.com/pricing?x=1",
                                 "r": "https://www.google.com/", "ip": "81.2.69.160",
                                 "ua": CHROME})
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            bodies = batch_bodies(site["id"]) if args.batches else [body]
            per = BATCH_SIZE if args.batches else 1
            runs = []
            for _ in range(args.runs):
                started = time.thread_time()
                for n in range(args.requests):
                    result = client.simulate_post("/api/v1/events", body=bodies[n % len(bodies)],
                                                  headers=headers)
                runs.append((time.thread_time() - started) / args.requests / per * 1e6)
                if result.status_code != 204:
                    raise SystemExit(f"answered {result.status_code}: {result.text}")
        finally:
            tally.stop(timeout=10)
    print(f"request thread CPU us per {'batched' if args.batches else 'single'} event:", [round(run, 1) for run in runs],
          f"best {min(runs):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
