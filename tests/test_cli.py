"""The `tally` command contract, run as the real console script against a real file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import cli_json, database_dump, is_postgres, latest_version, rows, run_cli


def test_account_site_key_lifecycle(db_path):
    account = cli_json("account", "create", "--name", "Acme", db=db_path)
    assert set(account) == {"id", "name", "plan"}
    assert account["name"] == "Acme" and account["plan"] == "free"

    starter = cli_json("account", "create", "--name", "Big", "--plan", "starter", db=db_path)
    assert starter["plan"] == "starter"
    listing = cli_json("account", "list", db=db_path)
    assert [a["id"] for a in listing["accounts"]] == [account["id"], starter["id"]]

    upgraded = cli_json("account", "set-plan", account["id"], "growth", db=db_path)
    assert upgraded == {"id": account["id"], "name": "Acme", "plan": "growth"}

    site = cli_json("site", "create", "--account", account["id"], "--host", "Example.COM",
                    "--host", "www.example.com", db=db_path)
    assert site == {"id": site["id"], "account": account["id"],
                    "hosts": ["example.com", "www.example.com"]}
    assert cli_json("site", "list", db=db_path)["sites"] == [site]
    assert cli_json("site", "list", "--account", starter["id"], db=db_path)["sites"] == []

    key = cli_json("key", "create", "--site", site["id"], "--scope", "events",
                   "--scope", "payments", db=db_path)
    assert set(key) == {"id", "key", "site", "scopes"}
    assert key["key"].startswith("tly_") and len(key["key"]) == 47
    assert key["scopes"] == ["events", "payments"] and key["site"] == site["id"]

    keys = cli_json("key", "list", "--site", site["id"], db=db_path)["keys"]
    assert [k["id"] for k in keys] == [key["id"]]
    assert keys[0]["revoked"] is False
    assert key["key"] not in repr(keys)

    assert cli_json("key", "revoke", key["id"], db=db_path) == {"id": key["id"], "revoked": True}
    assert cli_json("key", "list", db=db_path)["keys"][0]["revoked"] is True


def test_json_flag_before_the_command(db_path):
    account = cli_json("--json", "account", "create", "--name", "A", db=db_path)
    assert account["plan"] == "free"


def test_secret_is_stored_only_as_a_hash(db_path):
    account = cli_json("account", "create", "--name", "A", db=db_path)
    site = cli_json("site", "create", "--account", account["id"], "--host", "a.test", db=db_path)
    key = cli_json("key", "create", "--site", site["id"], "--scope", "events", db=db_path)
    if is_postgres(db_path):  # everything stored, as pg_dump writes it out
        raw = database_dump(db_path).encode()
        assert site["id"].encode() in raw
    else:
        raw = b"".join(p.read_bytes() for p in Path(db_path).parent.glob("tally.db*"))
    assert key["key"].encode() not in raw
    assert key["key"][4:].encode() not in raw


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["account", "set-plan", "acct_missing", "free"], "no account acct_missing"),
        (["site", "create", "--account", "acct_missing", "--host", "a.test"], "no account"),
        (["key", "create", "--site", "site_missing", "--scope", "events"], "no site"),
        (["key", "revoke", "key_missing"], "no key key_missing"),
        (["key", "list", "--site", "site_missing"], "no site"),
    ],
)
def test_unknown_ids_fail_with_one_line(db_path, args, fragment):
    proc = run_cli(*args, "--json", db=db_path, check=False)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert fragment in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ["account", "create", "--name", "A", "--plan", "platinum"],
        ["account", "create"],
        ["key", "create", "--site", "x", "--scope", "admin"],
        ["site", "create", "--account", "x"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_non_zero(db_path, args):
    proc = run_cli(*args, db=db_path, check=False)
    assert proc.returncode != 0 and proc.stdout == ""


def test_bad_host_writes_nothing(db_path):
    account = cli_json("account", "create", "--name", "A", db=db_path)
    proc = run_cli("site", "create", "--account", account["id"], "--host", "ok.test",
                   "--host", "http://bad/", db=db_path, check=False)
    assert proc.returncode == 1 and "invalid host" in proc.stderr
    assert cli_json("site", "list", db=db_path)["sites"] == []


def test_human_output_is_aligned_columns(db_path):
    run_cli("account", "create", "--name", "Short", db=db_path)
    run_cli("account", "create", "--name", "A much longer name", "--plan", "scale", db=db_path)
    lines = run_cli("account", "list", db=db_path).stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "PLAN"]
    plan_column = lines[0].index("PLAN")
    assert lines[1][plan_column:].strip() == "free"
    assert lines[2][plan_column:].strip() == "scale"


def test_schema_version_is_recorded(db_path):
    from storage.db import schema

    assert cli_json("init", db=db_path)["schema_version"] == latest_version(db_path)
    if is_postgres(db_path):
        assert rows(db_path, "SELECT version FROM tally_schema_version") == [
            {"version": latest_version(db_path)}]
        return
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema()[0]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_default_db_path_parent_is_created(tmp_path):
    nested = tmp_path / "deep" / "er" / "tally.db"
    run_cli("init", db=str(nested))
    assert nested.exists()


def test_unopenable_db_is_a_clear_error(tmp_path):
    (tmp_path / "dir.db").mkdir()
    proc = run_cli("init", db=str(tmp_path / "dir.db"), check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("tally: ")


def test_every_command_but_report_parses_without_the_reports_modules():
    """cli._OTHER_COMMANDS (the lines parsed without `tally report`'s parsers) names every
    command of the whole parser but report, so no command loses its parser."""
    import argparse

    import cli

    commands = next(a for a in cli.build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) - {"report"} == cli._OTHER_COMMANDS
    assert cli._may_be_a_report(["--json", "report", "traffic"])
    assert cli._may_be_a_report(["--help"])
    assert cli._may_be_a_report(["frob"])
    assert not cli._may_be_a_report(["key", "list", "--site", "report"])


def test_a_command_that_is_not_a_report_imports_no_report_module(db_path):
    """`tally check` (and every command but report) starts without the reports' modules,
    which take longer to import than most commands take to run."""
    run_cli("init", db=db_path)
    proc = run_cli("check", "--json", db=db_path,
                   env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "storage.check" in imported
    assert not {m for m in imported if m.startswith("reports")}, sorted(
        m for m in imported if m.startswith("reports"))
