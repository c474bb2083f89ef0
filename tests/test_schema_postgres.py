"""storage/schema_postgres.sql is the twin of schema.sql: the same tables, columns, keys,
indexes and triggers; every CHECK refuses the same rows; the triggers give the same first
touch. Needs the PostgreSQL at TALLY_TEST_DATABASE_URL: skipped loudly when it does not
answer, failed under CI=true.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3

import psycopg
import pytest
from psycopg import sql

from storage.check import FLUSH_CHECKED_REFERENCES
from tests.conftest import REPO

PG_URL = os.environ.get("TALLY_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
SQLITE_SCHEMA = REPO / "schema.sql"
PG_SCHEMA = REPO / "storage" / "schema_postgres.sql"

PG_TYPES = {"INTEGER": "bigint", "TEXT": "text", "BLOB": "bytea", "REAL": "double precision"}


def _unavailable(message: str):
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def pg():
    """A connection whose search_path is a new schema holding schema_postgres.sql."""
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        _unavailable(f"*** PostgreSQL does not answer at {PG_URL}: the PostgreSQL schema "
                     f"tests cannot run ({exc}). ***")
    name = f"t_{secrets.token_hex(6)}"
    schema = sql.Identifier(name)
    try:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        with psycopg.connect(PG_URL, autocommit=True, options=f"-csearch_path={name}") as conn:
            conn.execute(PG_SCHEMA.read_text(encoding="utf-8"))
            yield conn
    finally:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(schema))
        admin.close()


@pytest.fixture
def lite(tmp_path):
    conn = sqlite3.connect(tmp_path / "tally.db", isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.executescript(SQLITE_SCHEMA.read_text(encoding="utf-8"))
    yield conn
    conn.close()


# Structure -------------------------------------------------------------------------------

def _sqlite_tables(conn) -> list[str]:
    return [name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name")]


def _pg_tables(conn) -> list[str]:
    return [name for (name,) in conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace"
        " AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY c.relname")]


def _table_sql(conn, table: str) -> str:
    (text,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                           (table,)).fetchone()
    return re.sub(r"--[^\n]*", "", text)


def _sqlite_columns(conn, table: str) -> list[tuple]:
    """(name, PostgreSQL type, not null, identity, default) per column, in order."""
    info = conn.execute("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?)"
                        " ORDER BY cid", (table,)).fetchall()
    pk_columns = [row for row in info if row[4]]
    rowid_alias = (len(pk_columns) == 1 and pk_columns[0][1] == "INTEGER"
                   and "WITHOUT ROWID" not in _table_sql(conn, table))
    # Every primary key here is a rowid alias or in a WITHOUT ROWID table: never NULL.
    return [(name, PG_TYPES[kind], bool(notnull or pk), rowid_alias and bool(pk), default)
            for name, kind, notnull, default, pk in info]


def _pg_columns(conn, table: str) -> list[tuple]:
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
        "       a.attidentity = 'd', pg_get_expr(d.adbin, d.adrelid)"
        "  FROM pg_attribute a LEFT JOIN pg_attrdef d"
        "       ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum", (table,)).fetchall()
    return [(name, kind, notnull, identity,
             re.sub(r"::(text|bigint)$", "", default) if default else None)
            for name, kind, notnull, identity, default in rows]


def _sqlite_keys(conn, table: str) -> set[tuple]:
    """('p' | 'u', columns) and ('f', columns, table, columns, on delete) of a table."""
    info = conn.execute("SELECT name, pk FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk",
                        (table,)).fetchall()
    keys = {("p", tuple(name for name, _ in info))} if info else set()
    for (index,) in conn.execute("SELECT name FROM pragma_index_list(?) WHERE origin = 'u'",
                                 (table,)):
        keys.add(("u", tuple(name for (name,) in conn.execute(
            "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (index,)))))
    foreign = {}
    for key_id, parent, child, parent_column, on_delete in conn.execute(
            'SELECT id, "table", "from", "to", on_delete FROM pragma_foreign_key_list(?)'
            " ORDER BY id, seq", (table,)):
        foreign.setdefault(key_id, (parent, on_delete, [], []))
        foreign[key_id][2].append(child)
        foreign[key_id][3].append(parent_column)
    for parent, on_delete, children, parents in foreign.values():
        keys.add(("f", tuple(children), parent, tuple(parents), on_delete))
    return keys


_PG_ON_DELETE = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL",
                 "d": "SET DEFAULT"}


def _pg_keys(conn, table: str) -> set[tuple]:
    keys = set()
    for kind, children, parent, parents, on_delete in conn.execute(
            "SELECT contype,"
            "       ARRAY(SELECT a.attname FROM unnest(conkey) WITH ORDINALITY k(n, o)"
            "              JOIN pg_attribute a ON a.attrelid = conrelid AND a.attnum = k.n"
            "             ORDER BY k.o),"
            "       confrelid::regclass::text,"
            "       ARRAY(SELECT a.attname FROM unnest(confkey) WITH ORDINALITY k(n, o)"
            "              JOIN pg_attribute a ON a.attrelid = confrelid AND a.attnum = k.n"
            "             ORDER BY k.o),"
            "       confdeltype"
            "  FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f')", (table,)):
        if kind == "f":
            keys.add(("f", tuple(children), parent, tuple(parents), _PG_ON_DELETE[on_delete]))
        else:
            keys.add((kind, tuple(children)))
    return keys


def _sqlite_indexes(conn) -> dict[str, tuple]:
    """CREATE INDEX'es: name -> (table, columns, unique, partial predicate)."""
    indexes = {}
    for name, table, text in conn.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"):
        columns = tuple(column for (column,) in conn.execute(
            "SELECT name FROM pragma_index_info(?) ORDER BY seqno", (name,)))
        predicate = re.search(r"\bWHERE\s+(.*?)\s*$", text, re.S)
        indexes[name] = (table, columns, text.upper().startswith("CREATE UNIQUE"),
                         predicate.group(1) if predicate else None)
    return indexes


def _pg_indexes(conn) -> dict[str, tuple]:
    """Indexes not made by a PRIMARY KEY or UNIQUE constraint, as _sqlite_indexes."""
    rows = conn.execute(
        "SELECT c.relname, t.relname,"
        "       ARRAY(SELECT a.attname FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(n, o)"
        "              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n"
        "             ORDER BY k.o),"
        "       i.indisunique, pg_get_expr(i.indpred, i.indrelid)"
        "  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        "       JOIN pg_class t ON t.oid = i.indrelid"
        " WHERE t.relnamespace = current_schema()::regnamespace AND NOT t.relispartition"
        "   AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = i.indexrelid)").fetchall()
    return {name: (table, tuple(columns), unique,
                   re.fullmatch(r"\((.*)\)", predicate).group(1) if predicate else None)
            for name, table, columns, unique, predicate in rows}


_TRIGGER = re.compile(r"\b(AFTER|BEFORE) (INSERT|UPDATE|DELETE)(?: OF ([\w, ]+?))?\s+ON (?:\w+\.)?(\w+)",
                      re.I)


def _trigger_signature(text: str) -> tuple:
    timing, event, columns, table = _TRIGGER.search(text).groups()
    return (timing.upper(), event.upper(),
            tuple(c.strip() for c in columns.split(",")) if columns else (), table)


def _sqlite_triggers(conn) -> dict[str, tuple]:
    return {name: _trigger_signature(text) for name, text in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")}


def _pg_triggers(conn) -> dict[str, tuple]:
    return {name: _trigger_signature(text) for name, text in conn.execute(
        "SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c"
        " ON c.oid = t.tgrelid WHERE NOT t.tgisinternal"
        " AND c.relnamespace = current_schema()::regnamespace")}


def _check_count(text: str) -> int:
    return len(re.findall(r"\bCHECK\s*\(", text, re.I))


def _pg_check_count(conn, table: str) -> int:
    (count,) = conn.execute("SELECT count(*) FROM pg_constraint"
                            " WHERE conrelid = %s::regclass AND contype = 'c'", (table,)).fetchone()
    return count


def _partitioned(table: str, columns: list[tuple], keys: set[tuple]) -> tuple[list, set]:
    """What SQLite's table is on PostgreSQL when partitioned by month (schema_postgres.sql,
    events): ids from a sequence of its own, not an identity, and ts in the key."""
    if table != "events":
        return columns, keys
    columns = [("id", kind, True, False, "nextval('events_id'::regclass)") if name == "id"
               else (name, kind, notnull, identity, default)
               for name, kind, notnull, identity, default in columns]
    return columns, {("p", ("id", "ts")) if key == ("p", ("id",)) else key for key in keys}


def _flush_checked(table: str, keys: set[tuple]) -> set[tuple]:
    """SQLite's keys less the references PostgreSQL leaves to the flush's own check
    (schema_postgres.sql, "Checked by the flush")."""
    left_out = {("f", (column,), parent, (parent_column,), "NO ACTION")
                for child, column, parent, parent_column in FLUSH_CHECKED_REFERENCES
                if child == table}
    assert left_out <= keys, table  # each is a foreign key in schema.sql
    return keys - left_out


def test_tables_columns_keys_indexes_and_triggers_match(lite, pg):
    tables = _sqlite_tables(lite)
    assert _pg_tables(pg) == tables
    for table in tables:
        columns, keys = _partitioned(table, _sqlite_columns(lite, table),
                                     _flush_checked(table, _sqlite_keys(lite, table)))
        assert _pg_columns(pg, table) == columns, table
        assert _pg_keys(pg, table) == keys, table
        assert _pg_check_count(pg, table) == _check_count(_table_sql(lite, table)), table
    assert _pg_indexes(pg) == _sqlite_indexes(lite)
    assert _pg_triggers(pg) == _sqlite_triggers(lite)


def test_the_script_applies_again_to_a_database_with_rows(pg):
    pg.execute("INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'acc', 'A', 0)")
    pg.execute("INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 'site', 1, 0)")
    pg.execute("INSERT INTO customers (site_id, customer_id, as_of_ms, created_at, updated_at)"
               " VALUES (1, 'cus', 0, 0, 0)")
    triggers = _pg_triggers(pg)

    pg.execute(PG_SCHEMA.read_text(encoding="utf-8"))
    pg.execute(PG_SCHEMA.read_text(encoding="utf-8"))

    assert _pg_triggers(pg) == triggers
    assert pg.execute("SELECT customer_id FROM customers").fetchall() == [("cus",)]
    assert pg.execute("SELECT site_id, customer_id, session_id FROM customer_first_touch"
                      ).fetchall() == [(1, "cus", None)]
    assert pg.execute("SELECT count(*) FROM first_touch_refresh").fetchone() == (0,)


# CHECK parity ------------------------------------------------------------------------------

# The rows every case stands on, inserted in this order on both backends.
PARENTS = [
    ("accounts", {"id": 1, "public_id": "acc", "name": "A", "created_at": 0}),
    ("sites", {"id": 1, "public_id": "site", "account_id": 1, "created_at": 0}),
    ("customers", {"site_id": 1, "customer_id": "cus", "as_of_ms": 0, "created_at": 0,
                   "updated_at": 0}),
    ("sessions", {"id": 1, "site_id": 1, "visitor_id": 1, "started_at": 0, "last_seen_at": 0,
                  "channel": "Direct"}),
    ("users", {"id": 1, "public_id": "usr", "email": "a@b.c", "password_hash": "$argon2id$x",
               "created_at": 0}),
    ("traffic_day_dimensions", {"site_id": 1, "day": 1, "dimension": "page"}),
    ("traffic_segments", {"site_id": 1, "segment": "seg", "created_at": 0}),
    ("traffic_segment_dimensions", {"site_id": 1, "segment": "seg", "dimension": "page",
                                    "day": 1}),
]

HASH = bytes(32)
_SUBSCRIPTION = {"site_id": 1, "subscription_id": "sub", "customer_id": "cus",
                 "effective_at_ms": 0, "currency": "EUR", "status": "active",
                 "started_at": "2026-01-01T00:00:00Z", "started_at_ms": 0}
# A row each table accepts; a case replaces one column's value in it.
VALID = {
    "accounts": {"public_id": "acc2", "name": "B", "created_at": 0},
    "site_hosts": {"site_id": 1, "host": "shop.test"},
    "api_keys": {"public_id": "key", "site_id": 1, "secret_hash": HASH, "prefix": "tk_",
                 "scopes": "events", "created_at": 0},
    "customers": {"site_id": 1, "customer_id": "cus2", "as_of_ms": 0, "created_at": 0,
                  "updated_at": 0},
    "payments": {"site_id": 1, "payment_id": "pay", "customer_id": "cus", "amount": "10",
                 "currency": "EUR", "kind": "charge", "status": "succeeded",
                 "paid_at": "2026-01-01T00:00:00Z", "paid_at_ms": 0, "created_at": 0,
                 "updated_at": 0},
    "subscription_observations": {**_SUBSCRIPTION, "event_id": "evt", "received_at": 0},
    "subscriptions": {**_SUBSCRIPTION, "updated_at": 0},
    "events": {"site_id": 1, "ts": 0, "name": "pageview", "pathname": "/", "url": "https://s/",
               "hostname": "s"},
    "visitor_salts": {"day": 1, "salt": HASH, "created_at": 0},
    "monthly_usage": {"account_id": 1, "month": "2026-01", "events": 0},
    "sessions": {"site_id": 1, "visitor_id": 2, "started_at": 0, "last_seen_at": 0,
                 "channel": "Direct"},
    "visitor_identities": {"site_id": 1, "uid": "u", "visitor_id": 1, "linked_at": 0},
    "traffic_days": {"site_id": 1, "day": 1, "visitors": 0, "pageviews": 0, "sessions": 1,
                     "events": 0, "bounces": 0, "duration_ms": 0},
    "traffic_day_dimensions": {"site_id": 1, "day": 2, "dimension": "page"},
    "traffic_day_values": {"site_id": 1, "day": 1, "dimension": "page", "value": "/",
                           "visitors": 0, "pageviews": 0, "events": 0},
    "stripe_webhook_secrets": {"site_id": 1, "secret": "whsec_x", "fingerprint": "f",
                               "created_at": 0},
    "stripe_events": {"site_id": 1, "event_id": "evt", "type": "t", "created": 0,
                      "received_at": 0},
    "browser_id_key": {"id": 1, "key": HASH, "created_at": 0},
    "site_identity_secrets": {"site_id": 1, "secret": "tis_" + "s" * 43, "created_at": 0},
    "sign_in_key": {"id": 1, "key": HASH, "created_at": 0},
    "users": {"public_id": "usr2", "email": "b@b.c", "password_hash": "$argon2id$x",
              "created_at": 0},
    "user_sessions": {"id_hash": HASH, "user_id": 1, "csrf_token": "c" * 32, "created_at": 0,
                      "expires_at": 1},
    "shared_links": {"public_id": "shr", "site_id": 1, "token_hash": HASH, "revenue": 0,
                     "created_at": 0},
    "user_accounts": {"user_id": 1, "account_id": 1, "role": "owner"},
    "setup_tokens": {"token_hash": HASH, "created_at": 0, "expires_at": 1},
    "invitations": {"public_id": "inv", "account_id": 1, "role": "viewer", "token_hash": HASH,
                    "created_at": 0, "expires_at": 1},
    "funnels": {"site_id": 1, "name": "f", "steps": '["page:/", "payment"]', "created_at": 0},
    "deleted_events": {"account_id": 1, "month": "2026-01", "events": 0, "early": 0, "late": 0},
    "traffic_segments": {"site_id": 1, "segment": "seg2", "created_at": 0},
    "traffic_segment_days": {"site_id": 1, "segment": "seg", "day": 1, "visitors": 0,
                             "pageviews": 0, "sessions": 1, "events": 0, "bounces": 0,
                             "duration_ms": 0, "conversions": 0, "goal_events": 0},
    "traffic_segment_values": {"site_id": 1, "segment": "seg", "dimension": "page", "day": 1,
                               "value": "/", "visitors": 0, "pageviews": 0, "events": 0,
                               "conversions": 0, "goal_events": 0},
    "dead_letters": {"site_id": 1, "account_id": 1, "month": "2026-01", "set_aside_at": 0,
                     "reason": "r", "event": "{}"},
}

_NESTED_2000 = "[" * 2000 + "]" * 2000
_NESTED_2001 = "[" * 2001 + "]" * 2001
# (table, {column: value}, whether SQLite accepts the row)
CASES = [
    ("accounts", {"name": ""}, False),
    ("accounts", {"name": "é" * 200}, True),
    ("accounts", {"name": "x" * 201}, False),
    ("accounts", {"plan": "scale"}, True),
    ("accounts", {"plan": "Free"}, False),
    ("accounts", {"plan": "enterprise"}, False),
    ("site_hosts", {"host": "Shop.test"}, False),
    ("site_hosts", {"host": "É.test"}, True),  # SQLite's lower() leaves non-ASCII letters
    ("site_hosts", {"host": ""}, False),
    ("site_hosts", {"host": "h" * 253}, True),
    ("site_hosts", {"host": "h" * 254}, False),
    ("api_keys", {"secret_hash": bytes(31)}, False),
    ("api_keys", {"secret_hash": bytes(33)}, False),
    ("api_keys", {"scopes": ""}, False),
    ("customers", {"customer_id": ""}, False),
    ("customers", {"customer_id": "c" * 128}, True),
    ("customers", {"customer_id": "c" * 129}, False),
    ("customers", {"email": "a@b"}, True),
    ("customers", {"email": "A@b"}, False),
    ("customers", {"email": "ab"}, False),
    ("customers", {"email": "É@b"}, True),
    ("customers", {"country": "US"}, True),
    ("customers", {"country": "us"}, False),
    ("customers", {"country": "USA"}, False),
    ("customers", {"country": "éS"}, True),  # SQLite's upper() leaves non-ASCII letters
    ("customers", {"metadata": '{"plan": "pro"}'}, True),
    ("customers", {"metadata": ' {"a": [1, -0.5e3, true, null]}\r\n'}, True),
    ("customers", {"metadata": '"\\ud800"'}, True),
    ("customers", {"metadata": '"\\u0000"'}, True),
    ("customers", {"metadata": _NESTED_2000}, True),
    ("customers", {"metadata": _NESTED_2001}, False),
    ("customers", {"metadata": '{"a": "' + "[" * 2001 + '"}'}, True),
    ("customers", {"metadata": "{"}, False),
    ("customers", {"metadata": ""}, False),
    ("customers", {"metadata": "[1,]"}, False),
    ("customers", {"metadata": "\f{}"}, False),
    ("customers", {"metadata": "01"}, False),
    ("customers", {"metadata": "1.e5"}, False),
    ("customers", {"metadata": "NaN"}, False),
    ("customers", {"metadata": '"a\tb"'}, False),
    ("customers", {"metadata": "{'a': 1}"}, False),
    ("payments", {"payment_id": ""}, False),
    ("payments", {"payment_id": "p" * 129}, False),
    ("payments", {"amount": "0.01"}, True),
    ("payments", {"amount": "10.5"}, True),
    ("payments", {"amount": "1.2.3"}, True),  # the GLOBs allow it; validation does not
    ("payments", {"amount": "10."}, True),
    ("payments", {"amount": "0"}, False),
    ("payments", {"amount": "0.00"}, False),
    ("payments", {"amount": ".5"}, False),
    ("payments", {"amount": "-1"}, False),
    ("payments", {"amount": "1e5"}, False),
    ("payments", {"amount": "1 "}, False),
    ("payments", {"amount": "1\n"}, False),
    ("payments", {"amount": "\u0663"}, False),  # ARABIC-INDIC DIGIT THREE
    ("payments", {"amount": ""}, False),
    ("payments", {"currency": "eur"}, False),
    ("payments", {"currency": "EU"}, False),
    ("payments", {"fee": "0"}, True),
    ("payments", {"fee": "0.30"}, True),
    ("payments", {"fee": "-0"}, False),
    ("payments", {"fee": ""}, False),
    ("payments", {"kind": "refund"}, True),
    ("payments", {"kind": "Refund"}, False),
    ("payments", {"status": "failed"}, True),
    ("payments", {"status": "paid"}, False),
    ("payments", {"metadata": "[]"}, True),
    ("payments", {"metadata": "x"}, False),
    ("subscription_observations", {"event_id": None}, False),
    ("subscription_observations", {"payment_id": "pay"}, False),
    ("subscription_observations", {"subscription_id": ""}, False),
    ("subscription_observations", {"interval": "month"}, True),
    ("subscription_observations", {"interval": "Month"}, False),
    ("subscription_observations", {"status": "ended"}, True),
    ("subscription_observations", {"status": "expired"}, False),
    ("subscription_observations", {"amount": "0"}, True),
    ("subscription_observations", {"amount": "x"}, False),
    ("subscriptions", {"subscription_id": "s" * 128}, True),
    ("subscriptions", {"subscription_id": "s" * 129}, False),
    ("subscriptions", {"interval": "fortnight"}, False),
    ("subscriptions", {"status": "past_due"}, True),
    ("subscriptions", {"status": "Active"}, False),
    ("subscriptions", {"amount": "9.99"}, True),
    ("subscriptions", {"amount": "-9.99"}, False),
    ("events", {"anonymous": 1}, True),
    ("monthly_usage", {"anonymous": 0}, True),
    ("monthly_usage", {"anonymous": -1}, False),
    ("events", {"anonymous": 0}, False),
    ("events", {"name": ""}, False),
    ("events", {"name": "n" * 64}, True),
    ("events", {"name": "n" * 65}, False),
    ("events", {"width": 0}, True),
    ("events", {"width": 32767}, True),
    ("events", {"width": -1}, False),
    ("events", {"width": 32768}, False),
    ("events", {"country": "DE"}, True),
    ("events", {"country": "D"}, False),
    ("events", {"device": "tablet"}, True),
    ("events", {"device": "Desktop"}, False),
    ("visitor_salts", {"salt": bytes(31)}, False),
    ("visitor_salts", {"dated": 1}, True),
    ("visitor_salts", {"dated": 2}, False),
    ("monthly_usage", {"month": "2026-19"}, True),
    ("monthly_usage", {"month": "2026-1"}, False),
    ("monthly_usage", {"month": "2026-21"}, False),
    ("monthly_usage", {"month": "2026-01\n"}, False),
    ("monthly_usage", {"month": "x2026-01"}, False),
    ("monthly_usage", {"month": "2026-011"}, False),
    ("monthly_usage", {"month": "\u0662\u0660\u0662\u0666-01"}, False),
    ("monthly_usage", {"events": -1}, False),
    ("sessions", {"last_seen_at": -1}, False),
    ("sessions", {"channel": ""}, False),
    ("sessions", {"channel": "c" * 40}, True),
    ("sessions", {"channel": "c" * 41}, False),
    ("sessions", {"pageviews": -1}, False),
    ("sessions", {"custom_events": -1}, False),
    ("visitor_identities", {"uid": ""}, False),
    ("visitor_identities", {"uid": "u" * 128}, True),
    ("visitor_identities", {"uid": "u" * 129}, False),
    ("visitor_identities", {"uid": "é" * 64}, True),  # 128 bytes
    ("visitor_identities", {"uid": "é" * 65}, False),  # 65 characters, 130 bytes
    ("visitor_identities", {"uid": "€" * 43}, False),  # 129 bytes
    ("traffic_days", {"visitors": -1}, False),
    ("traffic_days", {"pageviews": -1}, False),
    ("traffic_days", {"sessions": -1}, False),
    ("traffic_days", {"events": -1}, False),
    ("traffic_days", {"bounces": 1}, True),
    ("traffic_days", {"bounces": 2}, False),
    ("traffic_days", {"duration_ms": -1}, False),
    ("traffic_day_dimensions", {"dimension": "entry_page"}, True),
    ("traffic_day_dimensions", {"dimension": "Page"}, False),
    ("traffic_day_values", {"visitors": -1}, False),
    ("traffic_day_values", {"pageviews": -1}, False),
    ("traffic_day_values", {"events": -1}, False),
    ("stripe_webhook_secrets", {"secret": "s" * 6}, False),
    ("stripe_webhook_secrets", {"secret": "s" * 256}, True),
    ("stripe_webhook_secrets", {"secret": "s" * 257}, False),
    ("stripe_events", {"event_id": ""}, False),
    ("stripe_events", {"event_id": "e" * 255}, True),
    ("stripe_events", {"event_id": "e" * 256}, False),
    ("browser_id_key", {"id": 2}, False),
    ("browser_id_key", {"key": bytes(31)}, False),
    ("site_identity_secrets", {"secret": "s" * 31}, False),
    ("site_identity_secrets", {"secret": "s" * 128}, True),
    ("site_identity_secrets", {"secret": "s" * 129}, False),
    ("sign_in_key", {"id": 2}, False),
    ("sign_in_key", {"key": bytes(31)}, False),
    ("users", {"email": "B@b.c"}, False),
    ("users", {"email": "a@b"}, True),
    ("users", {"email": "ab"}, False),
    ("users", {"email": "e" * 254}, True),
    ("users", {"email": "e" * 255}, False),
    ("users", {"password_hash": "$ARGON2ID$v=19"}, True),  # SQLite's LIKE ignores ASCII case
    ("users", {"password_hash": "$argon2id$"}, True),
    ("users", {"password_hash": "$argon2i$v=19"}, False),
    ("users", {"password_hash": "$argon2id"}, False),
    ("users", {"password_hash": "x$argon2id$"}, False),
    ("users", {"password_hash": "$argon2\u0130d$x"}, False),  # İ: lower() is i outside ASCII rules
    ("user_sessions", {"id_hash": bytes(31)}, False),
    ("user_sessions", {"csrf_token": "c" * 31}, False),
    ("user_sessions", {"expires_at": 0}, False),
    ("shared_links", {"revenue": 1}, True),
    ("shared_links", {"revenue": 2}, False),
    ("shared_links", {"token_hash": bytes(31)}, False),
    ("user_accounts", {"role": "admin"}, True),
    ("user_accounts", {"role": "viewer"}, True),
    ("user_accounts", {"role": "Owner"}, False),
    ("setup_tokens", {"token_hash": bytes(31)}, False),
    ("setup_tokens", {"expires_at": 0}, False),
    ("invitations", {"role": "owner"}, True),
    ("invitations", {"role": "member"}, False),
    ("invitations", {"token_hash": bytes(33)}, False),
    ("invitations", {"expires_at": 0}, False),
    ("funnels", {"name": ""}, False),
    ("funnels", {"name": "n" * 100}, True),
    ("funnels", {"name": "n" * 101}, False),
    ("funnels", {"steps": "[1,"}, False),
    ("deleted_events", {"month": "2026-1"}, False),
    ("deleted_events", {"events": -1}, False),
    ("deleted_events", {"early": -1}, False),
    ("deleted_events", {"late": -1}, False),
    ("traffic_segments", {"segment": ""}, False),
    ("traffic_segments", {"segment": "s" * 40000}, True),
    ("traffic_segments", {"segment": "s" * 40001}, False),
    ("traffic_segment_days", {"visitors": -1}, False),
    ("traffic_segment_days", {"pageviews": -1}, False),
    ("traffic_segment_days", {"sessions": -1}, False),
    ("traffic_segment_days", {"events": -1}, False),
    ("traffic_segment_days", {"bounces": 2}, False),
    ("traffic_segment_days", {"duration_ms": -1}, False),
    ("traffic_segment_days", {"conversions": -1}, False),
    ("traffic_segment_days", {"goal_events": -1}, False),
    ("traffic_segment_values", {"visitors": -1}, False),
    ("traffic_segment_values", {"pageviews": -1}, False),
    ("traffic_segment_values", {"events": -1}, False),
    ("traffic_segment_values", {"conversions": -1}, False),
    ("traffic_segment_values", {"goal_events": -1}, False),
    ("dead_letters", {"event": '{"name": "pageview"}'}, True),
    ("dead_letters", {"event": "{"}, False),
]


def _sqlite_insert(conn, table: str, row: dict) -> None:
    columns = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    conn.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})",  # noqa: S608 - fixed names
                 tuple(row.values()))  # sql-safe: tables and columns of PARENTS, VALID, CASES


def _pg_insert(conn, table: str, row: dict) -> None:
    conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() for _ in row)), tuple(row.values()))


def _sqlite_accepts(conn, table: str, row: dict) -> bool:
    conn.execute("BEGIN")
    try:
        _sqlite_insert(conn, table, row)
    except sqlite3.IntegrityError as exc:
        assert "CHECK constraint failed" in str(exc), exc
        return False
    finally:
        conn.execute("ROLLBACK")
    return True


def _pg_accepts(conn, table: str, row: dict) -> bool:
    try:
        with conn.transaction(force_rollback=True):
            _pg_insert(conn, table, row)
    except psycopg.errors.CheckViolation:
        return False
    return True


def _checked_columns(table_sql: str) -> set[str]:
    """The columns of a CREATE TABLE whose definition holds a CHECK."""
    body = table_sql[table_sql.index("(") + 1:table_sql.rindex(")")]
    parts, depth, start = [], 0, 0
    for at, char in enumerate(body):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(body[start:at])
            start = at + 1
    parts.append(body[start:])
    return {part.split()[0] for part in parts if _check_count(part)}


def test_every_check_has_a_case(lite):
    covered = {(table, column) for table, change, _ in CASES for column in change}
    checked = {(table, column) for table in _sqlite_tables(lite)
               for column in _checked_columns(_table_sql(lite, table))}
    assert checked - covered == set()


def test_every_check_refuses_the_same_rows(lite, pg):
    for table, row in PARENTS:
        _sqlite_insert(lite, table, row)
        _pg_insert(pg, table, row)
    for table, change, accepted in CASES:
        row = {**VALID[table], **change}
        assert _sqlite_accepts(lite, table, row) is accepted, (table, change)
        assert _pg_accepts(pg, table, row) is accepted, (table, change)


# First touch -----------------------------------------------------------------------------

# Visitor 42's session 2 starts first; visitor 7 (user u7's) has session 1.
FIRST_TOUCH_SETUP = [
    "INSERT INTO accounts (id, public_id, name, created_at) VALUES (1, 'acc', 'A', 0)",
    "INSERT INTO sites (id, public_id, account_id, created_at) VALUES (1, 'site', 1, 0)",
    "INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at, channel)"
    " VALUES (1, 1, 7, 2000, 2000, 'Direct'), (2, 1, 42, 1000, 1000, 'Direct')",
    "INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at) VALUES (1, 'u7', 7, 0)",
]
# Each step, then the first touch of every customer.
FIRST_TOUCH_STEPS = [
    ("INSERT INTO customers (site_id, customer_id, user_id, visitor_id, as_of_ms, created_at,"
     " updated_at) VALUES (1, 'by_visitor', NULL, '42', 0, 0, 0),"
     " (1, 'by_user', 'u7', NULL, 0, 0, 0), (1, 'spaced', NULL, ' +042.0', 0, 0, 0),"
     " (1, 'unlinked', 'u9', '9', 0, 0, 0)",
     {"by_visitor": 2, "by_user": 1, "spaced": 2, "unlinked": None}),
    ("UPDATE customers SET visitor_id = '42' WHERE customer_id = 'by_user'",
     {"by_visitor": 2, "by_user": 2, "spaced": 2, "unlinked": None}),
    ("INSERT INTO visitor_identities (site_id, uid, visitor_id, linked_at)"
     " VALUES (1, 'u9', 7, 0)",
     {"by_visitor": 2, "by_user": 2, "spaced": 2, "unlinked": 1}),
    ("INSERT INTO sessions (id, site_id, visitor_id, started_at, last_seen_at, channel)"
     " VALUES (3, 1, 9, 3000, 3000, 'Direct')",
     {"by_visitor": 2, "by_user": 2, "spaced": 2, "unlinked": 1}),
    # Session 3 goes on under visitor 42 (a new day's id): a link beside its own id.
    ("INSERT INTO session_visitors (site_id, visitor_id, session_id) VALUES (1, 42, 3)",
     {"by_visitor": 2, "by_user": 2, "spaced": 2, "unlinked": 1}),
    # 'spaced' names 42 another way, which this trigger compares as text on both engines
    # (tests/test_first_touch.py's xfail): it keeps session 2.
    ("UPDATE sessions SET started_at = 500 WHERE id = 3",
     {"by_visitor": 3, "by_user": 3, "spaced": 2, "unlinked": 3}),
]


def _first_touch(conn) -> dict:
    return dict(conn.execute("SELECT customer_id, session_id FROM customer_first_touch"
                             " WHERE site_id = 1").fetchall())


def test_the_triggers_give_the_same_first_touch(lite, pg):
    for statement in FIRST_TOUCH_SETUP:
        lite.execute(statement)
        pg.execute(statement)
    for statement, expected in FIRST_TOUCH_STEPS:
        lite.execute(statement)
        pg.execute(statement)
        assert _first_touch(lite) == expected, statement
        assert _first_touch(pg) == expected, statement
        for conn in (lite, pg):
            assert conn.execute("SELECT count(*) FROM first_touch_refresh").fetchone() == (0,)


# Customers name visitors in text; SQLite compares that text with an INTEGER column as a
# number when it reads as one, which tally_text_as_integer reproduces.
VISITOR_TEXTS = ["42", "-42", " 42 ", "+42", "042", "42.0", "4.2e1", "42.", "\t42\n", "\f42",
                 "\v42", "4200e-2", "00000000000000000000042", "-0", "-.0", "0", "42abc",
                 "0x2A", ".", "-", "1e", "4 2", "", "\u0664\u0662", "9223372036854775807",
                 "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
                 "9223372036854775807.0", "9007199254740993.0", "9007199254740993", "1e400"]
VISITOR_IDS = [42, -42, 0, 9223372036854775807, -9223372036854775808, 9007199254740992,
               9007199254740993]


def test_visitor_text_matches_the_same_integer_visitor(lite, pg):
    lite.execute("CREATE TEMP TABLE ids (visitor_id INTEGER)")
    lite.execute("CREATE TEMP TABLE texts (visitor_text TEXT)")
    lite.executemany("INSERT INTO ids VALUES (?)", [(v,) for v in VISITOR_IDS])
    for text in VISITOR_TEXTS:
        lite.execute("DELETE FROM texts")
        lite.execute("INSERT INTO texts VALUES (?)", (text,))
        expected = [v for (v,) in lite.execute(
            "SELECT visitor_id FROM ids, texts WHERE visitor_id = visitor_text ORDER BY 1")]
        found = pg.execute("SELECT v FROM unnest(%s::bigint[]) v"
                           " WHERE v = tally_text_as_integer(%s) ORDER BY 1",
                           (VISITOR_IDS, text)).fetchall()
        assert [v for (v,) in found] == expected, repr(text)
