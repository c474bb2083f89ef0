"""Builds tests/data/tally-v8.db, the upgrade fixture: a database made by the release
whose schema.sql ends with `PRAGMA user_version = 8` (main at commit 31677c1).

Run from a checkout of that commit, with its venv:
    git worktree add /tmp/tally-v8 31677c1 && cd /tmp/tally-v8 && make install
    .venv/bin/python /path/to/this/make_upgrade_db.py OUT.db
It uses only the `tally` CLI and a real gunicorn over HTTP, as a user of that release
would. The file is checked in as built; this script documents how, it is not run by tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def tally(*args: str, db: str) -> dict:
    out = subprocess.run([str(BIN / "tally"), *args, "--json"], check=True, capture_output=True,
                         text=True, env={**os.environ, "TALLY_DB": db}).stdout
    return json.loads(out)


def post(url: str, key: str, body: dict) -> int:
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def main(out: str) -> None:
    db = str(Path(out).resolve())
    tally("init", db=db)
    account = tally("account", "create", "--name", "Upgrade Shop", "--plan", "free", db=db)
    site = tally("site", "create", "--account", account["id"], "--host", "shop.example", db=db)
    key = tally("key", "create", "--site", site["id"], "--scope", "events", "--scope", "payments",
                "--scope", "read", db=db)["key"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([str(BIN / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "1",
                               "app:app"], env={**os.environ, "TALLY_DB": db})
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        ua = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
        events = [
            {"e": "pageview", "u": "https://shop.example/", "r": "https://www.google.com/",
             "ip": "81.2.69.160", "ua": ua, "t": "Home"},
            {"e": "pageview", "u": "https://shop.example/pricing?utm_source=newsletter",
             "ip": "81.2.69.160", "ua": ua},
            {"e": "$identify", "u": "https://shop.example/pricing", "uid": "user-1",
             "ip": "81.2.69.160", "ua": ua},
            {"e": "signup", "u": "https://shop.example/signup", "ip": "81.2.69.160", "ua": ua,
             "p": {"plan": "pro"}},
            {"e": "pageview", "u": "https://shop.example/", "ip": "2.16.6.1",
             "ua": "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Safari/604.1"},
            {"e": "pageview", "u": "https://shop.example/", "ip": "66.249.66.1",
             "ua": "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"},
        ]
        assert post(base + "/api/v1/events", key, {"s": site["id"], "b": events}) == 204
        payment = {
            "payment_id": "in_upgrade_1", "amount": 29, "currency": "EUR", "fee": 1.2,
            "kind": "charge", "paid_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "customer": {"id": "cus_1", "email": "Ada@Example.com", "user_id": "user-1",
                         "name": "Ada L", "country": "GB", "metadata": {"tier": "gold"}},
            "metadata": {"order": "A-1"},
            "subscription": {"id": "sub_1", "plan": "Pro", "interval": "month", "amount": 29},
        }
        assert post(base + "/api/v1/payments", key, payment) == 200
    finally:
        server.send_signal(signal.SIGTERM)  # the workers flush their queues on the way out
        server.wait(60)
    assert tally("check", db=db)["ok"]
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("VACUUM")
    conn.close()
    Path(db + "-wal").unlink(missing_ok=True)
    Path(db + "-shm").unlink(missing_ok=True)
    print(json.dumps({"db": db, "site": site["id"], "account": account["id"]}))


if __name__ == "__main__":
    main(sys.argv[1])
