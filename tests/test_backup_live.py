"""`tally backup` while a real gunicorn is storing events, and the documented restore."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import orjson
import pytest

from tests.conftest import WAIT, bearer, cli_json, http, is_postgres, provision, rows

pytestmark = pytest.mark.slow

UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"


def test_backups_under_load_are_consistent_and_restore(db_path, server_factory, tmp_path,
                                                       restore_backup):
    _, site, key = provision(db_path, name="Backup", plan="scale", host="b.example",
                             scopes=("events", "payments", "read"))
    key = key["key"]
    server = server_factory(db_path, workers=2)
    headers = {**bearer(key), "Content-Type": "application/json"}
    payment = {"payment_id": "pay_before_backup", "amount": 12, "currency": "EUR", "kind": "charge",
               "paid_at": "2026-09-21T14:00:00Z", "customer": {"id": "cus_b"}}
    assert http("POST", server.url + "/api/v1/payments", orjson.dumps(payment), headers)[0] == 200

    stop = threading.Event()
    sent = {"events": 0, "payments": 0}
    counting = threading.Lock()

    def load():
        batch = {"s": site["id"], "b": [{"e": "pageview", "u": f"https://b.example/{i}",
                                         "ip": "81.2.69.160", "ua": UA} for i in range(20)]}
        body = orjson.dumps(batch)
        while not stop.is_set():
            if http("POST", server.url + "/api/v1/events", body, headers)[0] == 204:
                with counting:
                    sent["events"] += 20
            with counting:
                sent["payments"] += 1
                more = {**payment, "payment_id": f"pay_{sent['payments']}"}
            assert http("POST", server.url + "/api/v1/payments", orjson.dumps(more), headers)[0] == 200

    writers = [threading.Thread(target=load) for _ in range(2)]
    for writer in writers:
        writer.start()
    copies = []
    try:
        # Acknowledged is not yet stored: wait (bounded) until a flush has stored some, so
        # every copy below holds events, however loaded the machine is.
        deadline = time.monotonic() + WAIT
        while (sent["events"] < 200 or not rows(db_path, "SELECT 1 FROM events LIMIT 1")) \
                and time.monotonic() < deadline:
            threading.Event().wait(0.05)
        for n in range(3):
            copy = tmp_path / f"backup-{n}.db"
            result = cli_json("backup", str(copy), db=db_path)
            assert result["integrity"] == "ok"
            copies.append(copy)
    finally:
        stop.set()
        for writer in writers:
            writer.join(WAIT)
    counts = []
    for copy in copies:
        restored = restore_backup(db_path, copy)
        assert cli_json("check", db=restored)["ok"], copy
        counts.append(rows(restored, "SELECT count(*) AS n FROM events")[0]["n"])
        assert rows(restored, "SELECT count(*) AS n FROM payments WHERE payment_id = ?",
                    ("pay_before_backup",))[0]["n"] == 1
    assert counts == sorted(counts) and counts[-1] > 0
    assert server.stop() == 0
    assert rows(db_path, "SELECT count(*) AS n FROM events")[0]["n"] == sent["events"] >= counts[-1]

    # Restore, as README's runbook says. SQLite: stop, set the live files aside, copy the
    # backup in, check, start. PostgreSQL: pg_restore into a new database, check, point
    # the servers at it, start.
    if is_postgres(db_path):
        live = restore_backup(db_path, copies[0])
    else:
        live = db_path
        aside = tmp_path / "aside"
        aside.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{live}{suffix}").exists():
                shutil.move(f"{live}{suffix}", aside / f"tally.db{suffix}")
        shutil.copyfile(copies[0], live)
    assert cli_json("check", db=live)["ok"]
    restored = server_factory(live, workers=1)
    status, _, body = http("GET", restored.url + "/api/v1/payments/pay_before_backup", None, bearer(key))
    assert status == 200, body
    assert rows(live, "SELECT count(*) AS n FROM events")[0]["n"] == counts[0]
    assert http("POST", restored.url + "/api/v1/events", orjson.dumps(
        {"s": site["id"], "e": "pageview", "u": "https://b.example/after", "ua": UA}), headers)[0] == 204
    restored.stop()
    assert rows(live, "SELECT count(*) AS n FROM events")[0]["n"] == counts[0] + 1
