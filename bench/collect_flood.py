"""Issue 26's flood, replayed against a real gunicorn with Tally's default settings: a free
account, then POST /api/v1/collect with a forged visitor id each, first from one address,
then from a new address each (as X-Forwarded-For from the trusted loopback proxy, like the
nginx of Deploying would pass it); after each, the site's keyed POST /api/v1/events.

    .venv/bin/python -m bench.collect_flood [--requests 12000] [--workers 2]

Prints one JSON object: the answers by status and code, the wall time, and `tally usage`.
It reports and asserts nothing (figures on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import http.client
import os
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import orjson

from bench.measure import BIN, REPO, Service

THREADS = 8
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def tally(env: dict, *args: str) -> dict:
    proc = subprocess.run([str(BIN / "tally"), "--json", *args], capture_output=True,
                          cwd=REPO, env={**os.environ, **env}, timeout=60, check=True)
    return orjson.loads(proc.stdout)


def flood(url: str, site: str, requests: int, spread: bool) -> dict:
    """`requests` collect posts over THREADS keep-alive connections; answers by code."""
    host, port = url.removeprefix("http://").split(":")
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def worker(first: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        mine: Counter[str] = Counter()
        for n in range(first, requests, THREADS):
            body = orjson.dumps({"s": site, "e": "pageview", "u": "https://a.test/?utm_source=x",
                                 "v": f"{n:032x}"})
            headers = {"Content-Type": "text/plain", "User-Agent": UA}
            if spread:
                headers["X-Forwarded-For"] = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
            conn.request("POST", "/api/v1/collect", body, headers)
            resp = conn.getresponse()
            data = resp.read()
            code = orjson.loads(data)["error"]["code"] if data else ""
            mine[f"{resp.status} {code}".strip()] += 1
        conn.close()
        with lock:
            answers.update(mine)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"requests": requests, "seconds": round(time.monotonic() - started, 1),
            "answers": dict(sorted(answers.items()))}


def keyed(url: str, site: str, key: str, count: int = 20) -> dict:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    answers: Counter[int] = Counter()
    for _ in range(count):
        body = orjson.dumps({"s": site, "e": "Signup", "u": "https://a.test/"})
        conn.request("POST", "/api/v1/events", body,
                     {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        resp.read()
        answers[resp.status] += 1
    conn.close()
    return {str(status): n for status, n in sorted(answers.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tally-flood-") as folder:
        env = {"TALLY_DB": str(Path(folder) / "tally.db"), "TALLY_LOG_LEVEL": "WARNING"}
        tally(env, "init")
        account = tally(env, "account", "create", "--name", "Flooded", "--plan", "free")["id"]
        site = tally(env, "site", "create", "--account", account, "--host", "a.test")["id"]
        key = tally(env, "key", "create", "--site", site, "--scope", "events")["key"]
        service = Service("app:app", REPO / "gunicorn.conf.py", args.workers,
                          Path(folder) / "gunicorn.log", env).wait_ready()
        try:
            result = {"workers": args.workers, "load": os.getloadavg()}
            result["one_address"] = flood(service.url, site, args.requests, spread=False)
            result["one_address"]["keyed_after"] = keyed(service.url, site, key)
            result["new_address_each"] = flood(service.url, site, args.requests, spread=True)
            time.sleep(2.5)  # the flush (1 s) and the shared count's cache (1 s)
            result["new_address_each"]["keyed_after"] = keyed(service.url, site, key)
            time.sleep(1.5)
            result["usage"] = tally(env, "usage", account)
        finally:
            service.stop()
        conn = sqlite3.connect(env["TALLY_DB"])
        result["usage"]["anonymous"] = conn.execute(
            "SELECT sum(anonymous) FROM monthly_usage").fetchone()[0]
        conn.close()
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
