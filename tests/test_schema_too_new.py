"""A database a later release brought to a higher schema version is never written by this
one: the service refuses to start on it with one line, every command refuses it, and a
restore refuses such a backup, on both backends. The database at this release's own version,
or at any older one, is never refused (the upgrade tests start each older version; here the
same database set back to this release's version starts and serves)."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

import pytest

from storage.backend import open_database
from storage.db import StorageError
from tests.conftest import (
    Server,
    cli_json,
    config_for,
    execute,
    is_postgres,
    latest_version,
    rows,
)
from tests.lifecycle import fresh_place
from tests.test_restore import refused
from tests.test_startup_faults import assert_refused

PHRASE = "newer than this release of Tally knows"


def set_version(db: str, version: int) -> None:
    if is_postgres(db):
        assert execute(db, "UPDATE tally_schema_version SET version = ?", (version,)) == 1
        return
    conn = sqlite3.connect(db)
    try:
        conn.execute(f"PRAGMA user_version = {int(version)}")  # sql-safe: an int
    finally:
        conn.close()


def stored_version(db: str) -> int:
    if is_postgres(db):
        return rows(db, "SELECT version FROM tally_schema_version")[0]["version"]
    return rows(db, "PRAGMA user_version")[0]["user_version"]


@pytest.mark.slow
def test_a_later_releases_database_is_refused_and_left_as_it_is(db_path, tmp_path):
    account = cli_json("account", "create", "--name", "Later", db=db_path)
    later = latest_version(db_path) + 1
    set_version(db_path, later)

    with pytest.raises(StorageError, match=PHRASE):
        open_database(config_for(db_path)).check_startup()
    message = refused("account", "list", db=db_path)
    assert message.startswith("tally: ") and PHRASE in message
    assert f"schema version {later}" in message
    log = assert_refused(Server(db_path, workers=1, log_path=tmp_path / "server.log"), PHRASE)
    assert "Traceback" not in log
    assert stored_version(db_path) == later  # nothing moved it back down

    # This release's own version: the same database starts, serves and keeps what it had.
    set_version(db_path, latest_version(db_path))
    server = Server(db_path, workers=1).wait_ready()
    try:
        assert cli_json("account", "list", db=db_path)["accounts"][0]["id"] == account["id"]
    finally:
        server.stop()
    assert stored_version(db_path) == latest_version(db_path)


def _later_backup(db: str, folder: Path) -> Path:
    """A later release's database copied by `tally backup`, which copies a database as it
    is (it writes nothing to it), then the database set back to this release's version."""
    backup = folder / "later-backup"
    set_version(db, latest_version(db) + 1)
    copied = cli_json("backup", str(backup), db=db)
    assert copied["user_version"] == latest_version(db) + 1 and copied["integrity"] == "ok"
    set_version(db, latest_version(db))
    return backup


def test_a_later_releases_backup_is_not_restored(db_path, tmp_path):
    cli_json("account", "create", "--name", "Kept", db=db_path)
    own = tmp_path / "own-backup"
    assert cli_json("backup", str(own), db=db_path)["integrity"] == "ok"
    later = _later_backup(db_path, tmp_path)
    with ExitStack() as stack:
        target = fresh_place(db_path, tmp_path, stack)
        message = refused("restore", str(later), db=target)
        assert "newer than this release of Tally knows" in message and "nothing was restored" in message
        if not is_postgres(target):
            assert not Path(target).parent.exists() or list(Path(target).parent.iterdir()) == []
        # The same place takes this release's backup, and Tally starts on it.
        restored = cli_json("restore", str(own), db=target)
        assert restored["user_version"] == latest_version(target)
        assert [a["name"] for a in cli_json("account", "list", db=target)["accounts"]] == ["Kept"]
        open_database(config_for(target)).check_startup()
