"""storage.sparse.SparseInsert stores exactly what one executemany of the full rows stores.

Rows of the real events table go into two real databases of the backend under test (two
SQLite files, or two PostgreSQL schemas), one through SparseInsert (on SQLite binding only
the columns each row sets, on PostgreSQL one COPY) and one through the full 29-column
INSERT; the tables must be identical, ids included (rows keep their order across shapes).
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from storage.backend import open_database
from storage.events import EVENT_COLUMNS
from storage.sparse import SparseInsert
from tests.conftest import config_for, is_postgres, new_postgres_schema

FULL_INSERT = (
    "INSERT INTO events (" + ", ".join(EVENT_COLUMNS) + ")"  # noqa: S608 - fixed columns
    " VALUES (" + ", ".join("?" * len(EVENT_COLUMNS)) + ")"
)
PLAIN = [1, 1_790_000_000_000, "pageview", 42, "/", "https://example.com/", "example.com",
         None, None, None, None, None, None, None, "DE", "Firefox", "Linux", "desktop",
         None, None, None, None, None, None, None, None, None, None, None, 7]


def variant(**values) -> list:
    row = list(PLAIN)
    for name, value in values.items():
        row[EVENT_COLUMNS.index(name)] = value
    return row


ROWS = {
    "plain": PLAIN,
    "referrer and UTM": variant(referrer="https://www.google.com/", referrer_host="google.com",
                                utm_source="newsletter", utm_medium="email"),
    "falsy values are values, not NULL": variant(width=0, title="", props="{}", language=""),
    "no visitor, no session": variant(visitor_id=None, country=None, browser=None, os=None,
                                      device=None, session_id=None),
    "identify": variant(name="$identify", uid="user-1", session_id=None),
    "text COPY escapes, and U+0000": variant(title="tab\there\nline \\N \\ back\\",
                                              props='{"k":"\\u0000"}', uid="nul\x00\ue000"),
    "everything set": [value if value is not None else f"v{index}"
                       for index, value in enumerate(variant(width=1280, anonymous=1))],
}


@pytest.fixture
def databases(db_path, tmp_path):
    """Connections to the test's database ("sparse") and another of its backend ("full")."""
    with ExitStack() as stack:
        full = (stack.enter_context(new_postgres_schema()) if is_postgres(db_path)
                else str(tmp_path / "full.db"))
        conns = []
        for db in (db_path, full):
            conn = open_database(config_for(db)).connect()
            stack.callback(conn.close)
            conn.execute("INSERT INTO accounts (id, public_id, name, created_at)"
                         " VALUES (1, 'a', 'A', 0)")
            conn.execute("INSERT INTO sites (id, public_id, account_id, created_at)"
                         " VALUES (1, 's', 1, 0)")
            conns.append(conn)
        yield conns


@pytest.mark.parametrize("order", [
    list(ROWS),  # each shape once
    ["plain", "plain", "identify", "plain", "referrer and UTM", "referrer and UTM", "plain"],
    ["everything set", "no visitor, no session", "falsy values are values, not NULL", "plain"],
])
def test_rows_are_stored_as_a_full_insert_stores_them_in_their_order(databases, order):
    sparse, full = databases
    rows = [list(ROWS[name]) for name in order]
    for ts, row in enumerate(rows):
        row[EVENT_COLUMNS.index("ts")] = ts  # tells the rows apart by id order
    writer = SparseInsert("events", EVENT_COLUMNS)
    writer.write(sparse, rows)
    full.executemany(FULL_INSERT, rows)
    select = "SELECT id, " + ", ".join(EVENT_COLUMNS) + " FROM events ORDER BY id"  # noqa: S608 - fixed columns
    stored = [conn.execute(select).fetchall() for conn in databases]  # sql-safe: fixed columns
    assert stored[0] == stored[1]
    assert [row[1:] for row in stored[0]] == [tuple(row) for row in rows]
    assert [row[2] for row in stored[0]] == list(range(len(rows)))


@pytest.mark.parametrize("text", ["nul\x00", "private \ue000 use", "\ue000", "\\ \ue000",
                                  "\ue0ff\uefff", '"\x00"'])
def test_a_nul_or_the_escape_character_alone_is_stored_as_sent(databases, text):
    """Each in a row of its own, so a batch's one check must find it by itself."""
    sparse, full = databases
    row = variant(title=text, uid=text)
    SparseInsert("events", EVENT_COLUMNS).write(sparse, [row])
    full.executemany(FULL_INSERT, [row])
    stored = [conn.execute("SELECT title, uid FROM events").fetchall() for conn in databases]
    assert stored[0] == stored[1] == [(text, text)]


@pytest.mark.parametrize("row", [PLAIN[:-1], [*PLAIN, None], [*PLAIN, 1]])
def test_a_row_of_the_wrong_length_is_refused(databases, row):
    with pytest.raises(ValueError, match=f"{len(row)} values for {len(EVENT_COLUMNS)} columns"):
        SparseInsert("events", EVENT_COLUMNS).write(databases[0], [PLAIN, row])
    assert databases[0].execute("SELECT count(*) FROM events").fetchone()[0] == 0
