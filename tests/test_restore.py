"""`tally restore BACKUP` puts a `tally backup` in place of a database that is not there yet,
on both backends: checked, never over anything, left at the backup's own schema version
(Tally migrates it when it next opens it). tests/test_long_life.py restores a backup taken
under traffic and serves from it."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import ExitStack
from pathlib import Path

import orjson
import pytest

from storage.db import schema
from tests.conftest import cli_json, is_postgres, latest_version, rows, run_cli
from tests.lifecycle import fresh_place, server_now, tables_not_analyzed_since
from tests.test_sqlite_gates import _genuinely_damaged

V14 = Path(__file__).resolve().parent / "data" / "tally-v14" / "tally-v14.db"


def refused(*args: str, db: str) -> str:
    proc = run_cli(*args, db=db, check=False)
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_backup_is_restored_into_a_new_place_and_never_over_a_database(db_path, tmp_path):
    account = cli_json("account", "create", "--name", "Kept", "--plan", "growth", db=db_path)
    site = cli_json("site", "create", "--account", account["id"], "--host", "kept.test", db=db_path)
    backup = tmp_path / "backup"
    assert cli_json("backup", str(backup), db=db_path)["integrity"] == "ok"
    with ExitStack() as stack:
        target = fresh_place(db_path, tmp_path, stack)
        started = server_now(db_path) if is_postgres(db_path) else None
        restored = cli_json("restore", str(backup), db=target)
        if is_postgres(target):  # pg_restore leaves its tables unanalyzed; restore analyzes
            assert tables_not_analyzed_since(target, started) == []
        assert restored["restored_from"] == str(backup) and restored["user_version"] == latest_version(target)
        assert restored["check"]["ok"] and restored["check"]["integrity"] == "ok"
        assert cli_json("site", "list", db=target)["sites"] == [site]
        if not is_postgres(target):
            assert sorted(p.name for p in Path(target).parent.iterdir()) == ["tally.db"]

        # Written to since, then restored over: refused, and nothing changes.
        cli_json("account", "create", "--name", "Later", db=target)
        message = refused("restore", str(backup), db=target)
        assert "never overwrites" in message
        assert len(cli_json("account", "list", db=target)["accounts"]) == 2
        assert "never overwrites" in refused("restore", str(backup), db=db_path)

        # The other backend's backups are named for what they are.
        other = tmp_path / "other"
        if is_postgres(db_path):
            sqlite_file = tmp_path / "s.db"
            cli_json("init", db=str(sqlite_file))
            assert "is a SQLite database" in refused("restore", str(sqlite_file),
                                                     db=fresh_place(db_path, tmp_path, stack))
        else:
            other.write_bytes(b"PGDMP" + b"\0" * 64)
            assert "is a PostgreSQL archive" in refused("restore", str(other),
                                                        db=str(tmp_path / "new" / "t.db"))
        assert "no backup at" in refused("restore", str(tmp_path / "missing"), db=db_path)


@pytest.mark.sqlite_only  # the SQLite file and the files beside it
def test_sqlite_restore_refuses_a_stale_log_and_a_damaged_backup(tmp_path):
    db = str(tmp_path / "live" / "tally.db")
    cli_json("account", "create", "--name", "A", db=db)
    backup = tmp_path / "backup.db"
    cli_json("backup", str(backup), db=db)

    # The database was moved aside but its write-ahead log was left: a restored file would
    # be read through it.
    target = tmp_path / "restore" / "tally.db"
    target.parent.mkdir()
    Path(f"{target}-wal").write_bytes(b"left behind")
    assert "tally.db-wal already there" in refused("restore", str(backup), db=str(target))
    assert not target.exists()
    Path(f"{target}-wal").unlink()
    assert cli_json("restore", str(backup), db=str(target))["check"]["ok"]

    damaged = tmp_path / "damaged.db"
    shutil.copyfile(backup, damaged)
    _genuinely_damaged(str(damaged))
    elsewhere = tmp_path / "elsewhere" / "tally.db"
    message = refused("restore", str(damaged), db=str(elsewhere))
    assert "is damaged: NULL value in notes.body" in message and "earlier backup" in message
    assert not elsewhere.exists() and not Path(f"{elsewhere}.partial").exists()

    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    assert "is not a SQLite database" in refused("restore", str(text), db=str(elsewhere))


@pytest.mark.sqlite_only  # the previous release's SQLite file
def test_a_restored_older_backup_keeps_its_version_until_tally_opens_it(tmp_path):
    """So that going back after an upgrade works: the backup taken before it is restored as
    it was, and the previous release can open it."""
    target = str(tmp_path / "tally.db")
    restored = cli_json("restore", str(V14), db=target)
    assert restored["user_version"] == 14 and restored["check"]["ok"]
    # Its integrity is checked as it is; its usage with this release's statements, which
    # read this release's schema, once Tally has migrated it.
    assert restored["check"]["integrity"] == "ok" and not restored["check"]["usage"]["checked"]
    assert f"migrates it to version {schema()[0]} when it next starts" in run_cli(
        "restore", str(V14), db=str(tmp_path / "again.db")).stdout
    conn = sqlite3.connect(target)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
    finally:
        conn.close()
    assert cli_json("init", db=target)["schema_version"] == schema()[0]
    assert rows(target, "PRAGMA quick_check") == [{"quick_check": "ok"}]
    check = orjson.loads(run_cli("check", "--json", db=target).stdout)
    assert check["ok"] and check["usage"]["checked"] and check["usage"]["months"] == 1
