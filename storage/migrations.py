"""Changes schema.sql cannot make by itself: it only creates what is missing, and SQLite
cannot loosen a column's NOT NULL in place.

`db._ensure_schema` calls `before_script` and `after_script` around schema.sql, in its
transaction, with the user_version the file had (0: a new file, nothing to move).
Version 9: subscription_observations.payment_id and subscriptions.payment_id became
optional (a subscription state known without a payment) and observations gained
event_id. The old tables are renamed aside with their indexes dropped, schema.sql
creates the new ones, and the rows are copied over. Versions 14 and 15 move tables the
same way; versions 16 and 19 add columns (below). Version 20 only adds a table (funnels),
which schema.sql makes in an older file as in a new one: no step here
(tests/test_funnels.py upgrades a version-16 database on both engines). SQLite goes from
21 to 24, past PostgreSQL's own 22 and 23; version 25 adds visitor_salts.dated on both;
version 26 (PostgreSQL only) leaves a fifth of sessions' pages free for the flush's updates.
"""

from __future__ import annotations

import sqlite3

# Tables rebuilt for version 9, with the indexes schema.sql creates on them again.
_REBUILT_FOR_9 = {
    "subscription_observations": ("subscription_observations_sub",
                                  "subscription_observations_time"),
    "subscriptions": ("subscriptions_customer",),
}
_ASIDE = "{}_before_9"


# Version 14: visitor_identities.uid was checked with length(), which counts characters and
# stops at a NUL, so an accepted uid such as "\u0000x" could never be stored; now bytes.
_UID_ASIDE = "visitor_identities_before_14"


# Version 15: traffic_day_dimensions declared (site_id, day, dimension) under the key
# (site_id, dimension, day); SQLite 3.40's quick_check misreads such a WITHOUT ROWID table
# and reports NULLs that are not there, so start-up and backups refused a healthy file.
# traffic_day_values, whose foreign key names it, moves with it: renaming a parent rewrites
# its children's references, so both are set aside, made again and copied.
_REBUILT_FOR_15 = {  # table -> (indexes schema.sql makes again, columns)
    "traffic_day_values": (("traffic_day_values_read",),
                           "site_id, day, dimension, value, visitors, pageviews, events"),
    "traffic_day_dimensions": ((), "site_id, dimension, day"),
}


# Version 16: events.anonymous marks the events of POST /api/v1/collect (quota.usage:
# their `$identify` counts), and monthly_usage.anonymous counts them for the quota's keyed
# reserve. ADD COLUMN appends each last, where schema.sql has them.
_ADDED_IN_16 = {
    "events": "ALTER TABLE events ADD COLUMN anonymous INTEGER CHECK (anonymous = 1)",
    "monthly_usage": "ALTER TABLE monthly_usage ADD COLUMN anonymous INTEGER NOT NULL DEFAULT 0"
                     " CHECK (anonymous >= 0)",
}


# Version 19: user_accounts.role; every member before it could do everything, an owner.
_ROLE_ADDED_IN_19 = ("ALTER TABLE user_accounts ADD COLUMN role TEXT NOT NULL DEFAULT 'owner'"
                     " CHECK (role IN ('owner', 'admin', 'viewer'))")


# Version 24: session_visitors keeps a session's other visitor ids only, sessions.visitor_id
# holds its first (schema.sql, session_links); the rows that repeat it go. Both engines.
_LINKS_OF_24 = ("DELETE FROM session_visitors WHERE EXISTS (SELECT 1 FROM sessions s"
                " WHERE s.id = session_visitors.session_id"
                " AND s.visitor_id = session_visitors.visitor_id"
                " AND s.site_id = session_visitors.site_id)")


# Version 25: visitor_salts.dated; the salts already made stay undated (0), so the rest of
# their day keeps the ids it began with. Both engines.
_DATED_ADDED_IN_25 = ("ALTER TABLE visitor_salts ADD COLUMN dated INTEGER NOT NULL DEFAULT 0"
                      " CHECK (dated IN (0, 1))")


def before_script(conn: sqlite3.Connection, version: int) -> None:
    if 0 < version < 25 and _exists(conn, "visitor_salts") \
            and not _has_column(conn, "visitor_salts", "dated"):
        conn.execute(_DATED_ADDED_IN_25)
    if 0 < version < 19 and _exists(conn, "user_accounts") \
            and not _has_column(conn, "user_accounts", "role"):
        conn.execute(_ROLE_ADDED_IN_19)
    if 0 < version < 16:
        for table, statement in _ADDED_IN_16.items():
            if _exists(conn, table) and not _has_column(conn, table, "anonymous"):
                conn.execute(statement)
    if 0 < version < 9:
        for table, indexes in _REBUILT_FOR_9.items():
            if not _exists(conn, table):
                continue
            # sql-safe: identifiers from the fixed table _REBUILT_FOR_9
            conn.execute(f"ALTER TABLE {table} RENAME TO {_ASIDE.format(table)}")
            for index in indexes:
                conn.execute(f"DROP INDEX IF EXISTS {index}")  # sql-safe: fixed names above
    if 0 < version < 15:  # before the version-14 step, which leaves legacy renames
        for table, (indexes, _) in _REBUILT_FOR_15.items():
            if _exists(conn, table):
                for index in indexes:
                    conn.execute(f"DROP INDEX IF EXISTS {index}")  # sql-safe: fixed names above
                # sql-safe: identifiers from the fixed table _REBUILT_FOR_15
                conn.execute(f"ALTER TABLE {table} RENAME TO {table}_before_15")
    if 0 < version < 14 and _exists(conn, "visitor_identities"):
        # Its trigger and index go with it and schema.sql makes them again; legacy mode
        # keeps the other triggers' bodies naming visitor_identities, the new table. Last,
        # since a rename in the normal mode checks every trigger's tables.
        conn.execute("DROP TRIGGER IF EXISTS first_touch_new_identity")
        conn.execute("DROP INDEX IF EXISTS visitor_identities_visitor")
        conn.execute("PRAGMA legacy_alter_table = ON")
        conn.execute("ALTER TABLE visitor_identities RENAME TO visitor_identities_before_14")
        conn.execute("PRAGMA legacy_alter_table = OFF")


def after_script(conn: sqlite3.Connection, version: int) -> None:
    if 0 < version < 24:
        conn.execute(_LINKS_OF_24)
    if 0 < version < 15:
        moved = [table for table in reversed(_REBUILT_FOR_15) if _exists(conn, f"{table}_before_15")]
        for table in moved:  # parents first
            columns = _REBUILT_FOR_15[table][1]
            # sql-safe: identifiers from the fixed table _REBUILT_FOR_15
            conn.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_before_15")  # noqa: S608
        for table in reversed(moved):  # children first
            conn.execute(f"DROP TABLE {table}_before_15")  # sql-safe: fixed names above
    if 0 < version < 14 and _exists(conn, _UID_ASIDE):
        conn.execute("INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
                     " SELECT site_id, uid, visitor_id, linked_at FROM visitor_identities_before_14")
        conn.execute("DROP TABLE visitor_identities_before_14")
    if not 0 < version < 9:
        return
    for table in _REBUILT_FOR_9:
        aside = _ASIDE.format(table)
        if not _exists(conn, aside):
            continue
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({aside})")]  # sql-safe: fixed name
        names = ", ".join(columns)
        # sql-safe: identifiers from the fixed table and the columns SQLite reports for it
        conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {aside}")  # noqa: S608
        conn.execute(f"DROP TABLE {aside}")  # sql-safe: fixed name


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return conn.execute("SELECT 1 FROM pragma_table_info(?) WHERE name = ?",
                        (table, column)).fetchone() is not None


def _exists(conn: sqlite3.Connection, table: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (table,)).fetchone() is not None


# PostgreSQL databases begin at version 14, the first release that ran on PostgreSQL, so
# nothing above needs a twin. A later version that changes an existing table adds its
# PostgreSQL statements here; they run after schema_postgres.sql, in the same transaction,
# when the database was older than that version.
# Version 15 changed only the order SQLite declares traffic_day_dimensions' columns in;
# PostgreSQL's quick check has no such flaw, so its tables stay as they are.
POSTGRES_STEPS: dict[int, tuple[str, ...]] = {
    15: (),
    16: ("ALTER TABLE events ADD COLUMN IF NOT EXISTS anonymous BIGINT CHECK (anonymous = 1)",
         "ALTER TABLE monthly_usage ADD COLUMN IF NOT EXISTS anonymous BIGINT NOT NULL DEFAULT 0"
         " CHECK (anonymous >= 0)"),
    19: ("ALTER TABLE user_accounts ADD COLUMN IF NOT EXISTS role TEXT NOT NULL DEFAULT 'owner'"
         " CHECK (role IN ('owner', 'admin', 'viewer'))",),
    # Version 21: new sessions take their ids from the sequence (storage/sessions.py);
    # the flush used to write max(id) + 1 past it, so it continues after the largest id.
    21: ("SELECT setval(pg_get_serial_sequence('sessions', 'id'), max(id)) FROM sessions"
         " HAVING max(id) IS NOT NULL",),
    # Version 22 (PostgreSQL only): events partitioned by month. The old table was set
    # aside before the script (POSTGRES_STEPS_BEFORE) and the script made the new one; each
    # month of its rows gets its partition, then the rows move over, ids kept. A table
    # already partitioned (a database marked older than it is) is left as it is.
    22: ("DO $$ BEGIN IF to_regclass('events_before_22') IS NOT NULL THEN"
         " PERFORM count(tally_events_month(month)) FROM (SELECT DISTINCT extract(epoch FROM"
         " date_trunc('month', to_timestamp(ts / 1000.0) AT TIME ZONE 'UTC'))::bigint * 1000"
         " AS month FROM events_before_22) months;"
         " INSERT INTO events SELECT id, site_id, ts, name, visitor_id, pathname, url, hostname,"
         " referrer, referrer_host, title, width, language, uid, props, country, browser, os,"
         " device, utm_source, utm_medium, utm_campaign, utm_term, utm_content, gclid, gbraid,"
         " wbraid, msclkid, fbclid, session_id, anonymous FROM events_before_22;"
         " PERFORM setval('events_id', max(id)) FROM events HAVING max(id) IS NOT NULL;"
         " DROP TABLE events_before_22;"
         " END IF; END $$",),
    # Version 23 (PostgreSQL only): the foreign keys the flush checks itself, once per
    # transaction (schema_postgres.sql, "Checked by the flush"), are dropped; a partition's
    # copy of events' goes with it.
    23: ("DO $$ DECLARE k record; BEGIN"
         " FOR k IN SELECT conrelid::regclass AS child, conname FROM pg_constraint"
         " WHERE contype = 'f' AND conparentid = 0"
         " AND (conrelid, confrelid) IN (('events'::regclass, 'sites'::regclass),"
         " ('sessions'::regclass, 'sites'::regclass),"
         " ('session_visitors'::regclass, 'sites'::regclass),"
         " ('session_visitors'::regclass, 'sessions'::regclass)) LOOP"
         " EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', k.child, k.conname);"
         " END LOOP; END $$",),
    24: ("DELETE FROM session_visitors sv USING sessions s WHERE s.id = sv.session_id"
         " AND s.visitor_id = sv.visitor_id AND s.site_id = sv.site_id",),
    25: ("ALTER TABLE visitor_salts ADD COLUMN IF NOT EXISTS dated BIGINT NOT NULL DEFAULT 0"
         " CHECK (dated IN (0, 1))",),
    # Version 26 (PostgreSQL only): sessions' pages keep a fifth free for the flush's
    # updates (schema_postgres.sql runs the ALTER TABLE itself).
    26: (),
}

# Run before schema_postgres.sql, for databases older than the version: what must be out
# of the script's way (a table it makes anew under the same name).
POSTGRES_STEPS_BEFORE: dict[int, tuple[str, ...]] = {
    22: ("DO $$ BEGIN IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('events')) = 'r'"
         " THEN"
         " ALTER TABLE events ADD COLUMN IF NOT EXISTS anonymous BIGINT CHECK (anonymous = 1);"
         " ALTER TABLE events RENAME TO events_before_22;"
         " ALTER INDEX IF EXISTS events_pkey RENAME TO events_before_22_pkey;"
         " ALTER INDEX IF EXISTS events_site_ts RENAME TO events_before_22_site_ts;"
         " END IF; END $$",),
}


def postgres_version() -> int:
    """The schema version of a PostgreSQL database: schema.sql's, or later when a change
    was PostgreSQL's only (22: partitioned events, 23: the flush's own reference checks);
    a change to both goes past them (24: a session's first visitor id only in sessions)."""
    from storage.db import schema

    return max(schema()[0], *POSTGRES_STEPS)


def postgres_steps_before(found: int) -> list[str]:
    """The statements to run before the script on a PostgreSQL database at version `found`."""
    return postgres_steps(found, POSTGRES_STEPS_BEFORE)


def postgres_steps(found: int, steps: dict[int, tuple[str, ...]] | None = None) -> list[str]:
    """The statements that bring a PostgreSQL database from version `found` up to date."""
    steps = POSTGRES_STEPS if steps is None else steps
    if found == 0:  # a new database: schema_postgres.sql made all of it
        return []
    return [statement for version, statements in sorted(steps.items()) if found < version
            for statement in statements]
