"""A database made by the previous release opens under this one and is migrated in place.

tests/data/tally-v8.db was built by main at user_version 8 through its CLI and HTTP
(tests/data/make_upgrade_db.py says how): one site, five stored events in two sessions
(one $identify, a bot dropped), a payment with a customer linked by user id and a
subscription.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from storage.db import schema
from tests.conftest import cli_json, rows

FIXTURE = Path(__file__).resolve().parent / "data" / "tally-v8.db"
SITE = "site_3m3xavgiwjyqipcs"
DAY = "2026-11-26"


def user_version(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.sqlite_only  # the previous release's SQLite file, upgraded in place
def test_a_database_of_the_previous_release_is_migrated_in_place(tmp_path):
    db = str(tmp_path / "old.db")
    shutil.copyfile(FIXTURE, db)
    assert user_version(db) == 8
    before = {t: rows(db, f"SELECT count(*) AS n FROM {t}")[0]["n"]  # noqa: S608 - fixed names
              for t in ("events", "sessions", "payments", "customers", "subscriptions")}
    assert before == {"events": 5, "sessions": 2, "payments": 1, "customers": 1, "subscriptions": 1}

    assert cli_json("init", db=db)["ok"]
    assert user_version(db) == schema()[0]
    assert cli_json("check", db=db)["ok"]
    after = {t: rows(db, f"SELECT count(*) AS n FROM {t}")[0]["n"]  # noqa: S608 - fixed names
             for t in before}
    assert after == before

    traffic = cli_json("report", "traffic", "--site", SITE, "--from", DAY, "--to", DAY, db=db)
    assert traffic["aggregate"]["pageviews"] == 3
    assert traffic["aggregate"]["visitors"] == 2
    revenue = cli_json("report", "revenue", "--site", SITE, "--from", DAY, "--to", DAY, db=db)
    eur = revenue["currencies"]["EUR"]
    assert (eur["net"], eur["fees"]) == (29, 1.2)
    # The customer's first touch (Google, via the $identify link) survived the upgrade.
    assert [row["channel"] for row in eur["by_channel"]] == ["Organic Search"]
    mrr = cli_json("report", "mrr", "--site", SITE, "--at", DAY, db=db)["mrr"]
    assert mrr["currencies"]["EUR"]["mrr"] == 29
