"""PostgreSQL (schema version 26): sessions' pages keep a fifth free, so that the flush's
updates of the sessions its events continue (last_seen_at, the counts) stay on their page
(HOT) instead of adding an entry to each of sessions' indexes; a new database has it and
an older one gets it when it is upgraded."""

from __future__ import annotations

import psycopg

from app import create_app
from storage.migrations import postgres_version
from tests.conftest import WAIT, FakeClock, config_for, rows

_RELOPTIONS = "SELECT reloptions FROM pg_class WHERE oid = 'sessions'::regclass"


def _open(db: str) -> None:
    tally = create_app(config_for(db), clock=FakeClock())
    try:
        tally.db.connect().close()  # the schema is brought up to date on a first connection
    finally:
        tally.stop(timeout=WAIT)


def test_sessions_pages_keep_room_for_the_flush_updates_new_and_upgraded(postgres_schema):
    db = postgres_schema
    _open(db)
    assert rows(db, _RELOPTIONS) == [{"reloptions": ["fillfactor=80"]}]

    # The release before version 26 made sessions with full pages.
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("ALTER TABLE sessions RESET (fillfactor)")
        conn.execute("UPDATE tally_schema_version SET version = 25")
    assert rows(db, _RELOPTIONS) == [{"reloptions": None}]

    _open(db)
    assert rows(db, _RELOPTIONS) == [{"reloptions": ["fillfactor=80"]}]
    assert rows(db, "SELECT version FROM tally_schema_version") == [{"version": postgres_version()}]
