"""storage.recorded: the reads the SQLite flush decides on before the write lock, run in one
read transaction and checked again under the lock."""

from __future__ import annotations

import pytest

from storage.backend import open_database
from storage.recorded import recorded_reads
from storage.salts import insert_salt, read_salt
from tests.conftest import config_for

SALT = bytes(range(32))


@pytest.fixture
def db(db_path):
    database = open_database(config_for(db_path))
    yield database
    database.close()


@pytest.mark.sqlite_only
def test_the_reads_see_one_state_and_a_commit_meanwhile_is_noticed_under_the_lock(db):
    conn, other = db.connect(), db.connect()
    try:
        with recorded_reads(conn) as reads:
            assert read_salt(reads, 1) is None
            assert conn.in_transaction  # one read transaction for every read
            with db.transaction(other):
                insert_salt(other, 1, SALT, 0)
            assert read_salt(reads, 1) is None  # the state of the first read, not the commit
        assert not conn.in_transaction
        with db.transaction(conn):
            assert not reads.unchanged(conn)  # the read gives another row now
        with recorded_reads(conn) as again:
            assert read_salt(again, 1).salt == SALT
        with db.transaction(conn):
            assert again.unchanged(conn)  # nothing committed since
    finally:
        conn.close()
        other.close()


@pytest.mark.sqlite_only
def test_reads_inside_a_transaction_leave_it_to_its_owner(db):
    conn = db.connect()
    try:
        with db.transaction(conn):
            with recorded_reads(conn) as reads:
                assert read_salt(reads, 1) is None
            assert conn.in_transaction
            insert_salt(conn, 1, SALT, 0)
        assert read_salt(conn, 1).salt == SALT
    finally:
        conn.close()


@pytest.mark.sqlite_only
def test_a_recorded_decision_only_reads(db):
    conn = db.connect()
    try:
        with recorded_reads(conn) as reads, pytest.raises(TypeError, match="only reads"):
            insert_salt(reads, 1, SALT, 0)
        assert not conn.in_transaction
        assert read_salt(conn, 1) is None
    finally:
        conn.close()
