"""An unusable database or configuration at start: one clear line, a non-zero exit, no worker.

The unusable databases here are SQLite files (a folder, garbage, damaged pages, read-only);
PostgreSQL's own (unreachable, a bad URL) are in tests/test_postgres_faults.py."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from storage.backend import open_database
from storage.db import Database
from tests.conftest import WAIT, Server, config_for, run_cli
from tests.fsfaults import read_only


def _healthy(path: Path) -> Path:
    Database(str(path)).check_startup()
    return path


def _with_rows(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("CREATE TABLE filler (x BLOB)")
    conn.executemany("INSERT INTO filler VALUES (?)", [(os.urandom(400),) for _ in range(100)])
    conn.commit()
    conn.close()
    return path


def directory(tmp: Path) -> Path:
    path = tmp / "tally.db"
    path.mkdir()
    return path


def parent_is_a_file(tmp: Path) -> Path:
    (tmp / "plain").write_text("x")
    return tmp / "plain" / "tally.db"


def garbage(tmp: Path) -> Path:
    path = tmp / "tally.db"
    path.write_bytes(b"not a database, just some bytes " * 256)
    return path


def damaged_pages(tmp: Path) -> Path:
    path = _with_rows(tmp / "tally.db")
    data = bytearray(path.read_bytes())
    data[4096 * 2:4096 * 2 + 3000] = b"\xab" * 3000
    path.write_bytes(data)
    return path


def truncated(tmp: Path) -> Path:
    path = _with_rows(tmp / "tally.db")
    path.write_bytes(path.read_bytes()[: 4096 * 3])
    return path


CASES = [
    pytest.param(directory, "cannot open database", id="path-is-a-directory"),
    pytest.param(parent_is_a_file, "cannot open database", id="parent-is-a-file"),
    pytest.param(garbage, "file is not a database", id="not-a-database"),
    pytest.param(damaged_pages, "malformed", id="damaged-pages"),
    pytest.param(truncated, "malformed", id="truncated"),
]


def assert_refused(server: Server, phrase: str) -> str:
    code = server.proc.wait(WAIT)
    log = server.log()
    server.stop()
    assert code != 0
    assert "tally: refusing to start:" in log and phrase in log
    assert "Booting worker" not in log, "a worker started on an unusable database"
    return log


@pytest.mark.slow
@pytest.mark.sqlite_only  # a damaged or unreachable SQLite file
@pytest.mark.parametrize("make_path, phrase", CASES)
def test_gunicorn_refuses_an_unusable_database(tmp_path, make_path, phrase):
    path = make_path(tmp_path)
    assert_refused(Server(str(path), workers=1, log_path=tmp_path / "server.log"), phrase)


@pytest.mark.slow
@pytest.mark.sqlite_only  # the SQLite file's permissions
def test_gunicorn_refuses_a_read_only_database(tmp_path):
    path = _healthy(tmp_path / "tally.db")
    with read_only(path):
        assert_refused(Server(str(path), workers=1, log_path=tmp_path / "server.log"), "readonly database")


@pytest.mark.slow
@pytest.mark.sqlite_only  # the SQLite file's folder's permissions
def test_gunicorn_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "var"
    folder.mkdir()
    with read_only(folder):
        assert_refused(Server(str(folder / "tally.db"), workers=1, log_path=tmp_path / "server.log"), "cannot open database")


@pytest.mark.slow
def test_gunicorn_refuses_bad_configuration(db_path):
    server = Server(db_path, workers=1, env={"TALLY_QUEUE_MAX": "lots"})
    assert_refused(server, "TALLY_QUEUE_MAX must be a whole number")


@pytest.mark.sqlite_only  # a damaged or unreachable SQLite file
@pytest.mark.parametrize("make_path, phrase", CASES)
def test_cli_refuses_an_unusable_database(tmp_path, make_path, phrase):
    proc = run_cli("init", db=str(make_path(tmp_path)), check=False)
    assert proc.returncode != 0
    assert proc.stderr.startswith("tally: ") and phrase in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_healthy_database_starts(db_path):
    open_database(config_for(db_path)).check_startup()
    assert run_cli("init", db=db_path).returncode == 0
