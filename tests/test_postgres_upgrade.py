"""The schema version on PostgreSQL works as SQLite's user_version does: `tally init`
records it, an older database is brought up to date in one transaction by every process
that opens it first, and its rows are kept."""

from __future__ import annotations

from storage import migrations
from tests.conftest import cli_json, rows


def test_init_records_the_version_and_an_older_database_is_brought_up_to_date(postgres_schema):
    version = migrations.postgres_version()
    account = cli_json("account", "create", "--name", "Before", "--plan", "free", db=postgres_schema)
    assert rows(postgres_schema, "SELECT version FROM tally_schema_version") == [{"version": version}]
    conn_rows = rows(postgres_schema, "UPDATE tally_schema_version SET version = ? RETURNING version",
                     (version - 1,))
    assert conn_rows == [{"version": version - 1}]
    # The next process to open it (here: a tally command) upgrades it, keeping every row.
    assert cli_json("account", "list", db=postgres_schema)["accounts"][0]["id"] == account["id"]
    assert rows(postgres_schema, "SELECT version FROM tally_schema_version") == [{"version": version}]


def test_postgres_steps_run_only_those_newer_than_the_database():
    steps = {15: ("ALTER TABLE a ADD COLUMN b TEXT",), 16: ("CREATE INDEX c ON a (b)",)}
    assert migrations.postgres_steps(14, steps) == list(steps[15] + steps[16])
    assert migrations.postgres_steps(15, steps) == list(steps[16])
    assert migrations.postgres_steps(16, steps) == []
    assert migrations.postgres_steps(0) == []  # nothing to move before version 14
