"""Start-up and backup gates never refuse a healthy SQLite file, on the SQLite the venv links.

SQLite 3.40.1 (Debian 12's, which the venv's Python links) has a PRAGMA quick_check that
reports NULLs that are not there in a WITHOUT ROWID table whose PRIMARY KEY lists its
columns in another order than the table declares them; PRAGMA integrity_check says ok.
traffic_day_dimensions was such a table until version 15, so one report was enough for
Tally to refuse its next start and every backup.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
import webtest

from app import create_app
from storage.db import Database, StorageError, integrity_problems, schema
from storage.maintenance import backup
from tests.conftest import bearer, config_for, rows, run_cli

SCHEMA = (Path(__file__).resolve().parent.parent / "schema.sql").read_text()


def test_the_venv_links_a_known_sqlite():
    # README (Deploying, Upgrades) names the versions this suite runs on.
    major, minor, _ = (int(part) for part in sqlite3.sqlite_version.split("."))
    assert (major, minor) >= (3, 37), sqlite3.sqlite_version


def test_every_without_rowid_table_declares_its_key_first_in_key_order():
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    tables = [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE '%WITHOUT ROWID%'")]
    assert "traffic_day_dimensions" in tables
    for table in tables:
        info = conn.execute("SELECT name, pk FROM pragma_table_info(?) ORDER BY cid", (table,)).fetchall()
        declared = [name for name, _ in info]
        key = [name for name, pk in sorted(info, key=lambda row: row[1]) if pk]
        assert declared[:len(key)] == key, f"{table}: key {key}, columns {declared}"


def _old_layout(path: str) -> None:
    """traffic_day_dimensions as version 14 declared it (day before dimension), rows kept."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE old_dimensions (site_id INTEGER NOT NULL REFERENCES sites (id),"
                     " day INTEGER NOT NULL, dimension TEXT NOT NULL,"
                     " PRIMARY KEY (site_id, dimension, day)) WITHOUT ROWID")
        conn.execute("INSERT INTO old_dimensions SELECT site_id, day, dimension FROM traffic_day_dimensions")
        conn.execute("DROP TABLE traffic_day_dimensions")
        conn.execute("PRAGMA legacy_alter_table = ON")
        conn.execute("ALTER TABLE old_dimensions RENAME TO traffic_day_dimensions")
        conn.execute("PRAGMA user_version = 14")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _visit_then_report(client, site, tally, clock) -> list:
    """A pageview on the site's first day, then a breakdown two days later: the first two
    days are final, so the report stores them (traffic_day_dimensions)."""
    event = {"s": site["site"]["id"], "e": "pageview", "u": "https://example.com/a",
             "ip": "203.0.113.9", "ua": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0"}
    client.post_json("/api/v1/events", event, headers=bearer(site["key"]), status=204)
    assert tally.flusher.flush_now()
    clock.advance(2 * 86_400)
    return client.get("/api/v1/stats/breakdown?by=page&from=2026-09-21&to=2026-09-23",
                      headers=bearer(site["key"])).json["data"]


@pytest.mark.sqlite_only  # the SQLite file's own checks and layout
def test_a_report_leaves_a_file_every_gate_accepts(tmp_path, client, site, db_path, tally, clock):
    assert _visit_then_report(client, site, tally, clock)
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_day_dimensions")[0]["n"] > 0
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    Database(db_path).check_startup()
    assert backup(Database(db_path), str(tmp_path / "copy.db")).integrity == "ok"


@pytest.mark.sqlite_only  # a version-14 file's layout, moved in place
def test_version_14_dimensions_move_to_key_order_and_keep_their_rows(tmp_path, client, site,
                                                                    db_path, tally, clock):
    before = _visit_then_report(client, site, tally, clock)
    assert before
    tally.stop()
    stored = rows(db_path, "SELECT site_id, dimension, day FROM traffic_day_dimensions ORDER BY 1, 2, 3")
    values = rows(db_path, "SELECT count(*) AS n FROM traffic_day_values")[0]["n"]
    assert stored
    _old_layout(db_path)
    conn = sqlite3.connect(db_path)
    try:
        # The flaw itself, on the SQLite the venv links (fixed in later SQLite releases).
        quick = conn.execute("PRAGMA quick_check").fetchall()
        assert integrity_problems(conn) == []
    finally:
        conn.close()
    if sqlite3.sqlite_version_info < (3, 41, 0):
        assert quick and quick[0][0].startswith("NULL value in traffic_day_dimensions")

    Database(db_path).check_startup()  # migrates

    assert rows(db_path, "PRAGMA user_version") == [{"user_version": schema()[0]}]
    columns = [r["name"] for r in rows(db_path, "SELECT name FROM pragma_table_info('traffic_day_dimensions')")]
    assert columns == ["site_id", "dimension", "day"]
    assert rows(db_path, "SELECT site_id, dimension, day FROM traffic_day_dimensions ORDER BY 1, 2, 3") == stored
    assert rows(db_path, "SELECT count(*) AS n FROM traffic_day_values")[0]["n"] == values
    assert rows(db_path, "PRAGMA foreign_key_check") == []
    assert rows(db_path, "PRAGMA quick_check") == [{"quick_check": "ok"}]
    assert not [r for r in rows(db_path, "SELECT name FROM sqlite_master") if "before_15" in r["name"]]
    # The foreign key of traffic_day_values names the new table, and still holds.
    with pytest.raises(sqlite3.IntegrityError):
        conn = sqlite3.connect(db_path, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("INSERT INTO traffic_day_values (site_id, day, dimension, value, visitors,"
                         " pageviews, events) VALUES (1, 1, 'page', '/', 0, 0, 0)")
        finally:
            conn.close()
    # The same reports, read from the moved rows.
    app = create_app(config_for(db_path), clock=clock)
    try:
        assert webtest.TestApp(app).get(
            "/api/v1/stats/breakdown?by=page&from=2026-09-21&to=2026-09-23",
            headers=bearer(site["key"])).json["data"] == before
    finally:
        app.stop(timeout=5)


def _genuinely_damaged(path: str) -> None:
    """A NULL in a NOT NULL column, as damage (not a misreading) leaves it: both checks see it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES (NULL)")
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = 'CREATE TABLE notes (body TEXT NOT NULL)'"
                     " WHERE name = 'notes'")
    finally:
        conn.close()


@pytest.mark.sqlite_only
def test_a_damaged_file_is_refused_with_one_line_that_says_what_to_do(tmp_path):
    path = str(tmp_path / "tally.db")
    Database(path).check_startup()
    _genuinely_damaged(path)
    with pytest.raises(StorageError) as refused:
        Database(path).check_startup()
    message = str(refused.value)
    assert "\n" not in message
    assert re.search(r"is damaged: NULL value in notes\.body", message)
    assert "restore the latest backup" in message and "tally check" in message
    assert "`tally restore BACKUP`" in message
    # tally init is a gate too, and says the same in one line.
    proc = run_cli("init", db=path, check=False)
    assert proc.returncode != 0
    assert "NULL value in notes.body" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
