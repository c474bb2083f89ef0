"""The `tally` admin command. Reads TALLY_DB (through config) like the server does.

Every command takes --json and then prints exactly one JSON object on stdout.
Errors print one line on stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Sequence

import orjson

from config import Config, ConfigError
from storage.backend import open_database
from storage.db import Database, StorageError
from storage.directory import Directory, InvalidArgument, NotFound
from storage.people import ROLES
from vocabulary import PLAN_NAMES, SCOPES

# Each command imports what only it uses (in its handler): every `tally` run pays for the
# imports at the top, and the reports' modules alone take longer to import than most
# commands take to run.

STRIPE_SECRET_MAX_CHARS = 256
STRIPE_SECRET = re.compile(r"whsec_[A-Za-z0-9+/=_-]{1,250}")


class CliError(Exception):
    """A failure to report on one line of stderr."""


def build_parser(reports: bool = True) -> argparse.ArgumentParser:
    """The whole command line; with reports=False, without `tally report` (whose choices
    come from the reports' modules), for a line that names another command."""
    parser = argparse.ArgumentParser(prog="tally", description="Administer a Tally database.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    commands = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    commands.add_parser("init", help="create the database and apply the schema")
    serve = commands.add_parser("serve", help="serve HTTP under gunicorn with Tally's settings")
    serve.add_argument("--bind", metavar="ADDR", help="HOST:PORT or unix:PATH (default 127.0.0.1:8000)")
    serve.add_argument("--workers", type=_workers, metavar="N", help="worker processes (default 2)")
    setup_link = commands.add_parser(
        "setup-link", help="a new one-time link (24 h) that creates the first user and site")
    setup_link.add_argument("--bind", metavar="ADDR",
                            help="the address tally serve binds, for the link's host when "
                                 "TALLY_PUBLIC_URL is unset (default 127.0.0.1:8000)")
    commands.add_parser("check", help="integrity check, and monthly usage against stored events")
    backup = commands.add_parser("backup", help="a consistent copy of the database, while it serves")
    backup.add_argument("path", metavar="PATH", help="a new file (never overwritten)")
    restore = commands.add_parser(
        "restore", help="put a backup in place of the database, which must not be there yet")
    restore.add_argument("backup", metavar="BACKUP", help="a file tally backup wrote")
    migrate = commands.add_parser(
        "migrate-to-postgres", help="copy the SQLite database TALLY_DB into an empty PostgreSQL one")
    migrate.add_argument("--to", metavar="URL",
                         help="postgresql://user@host/db (default: TALLY_DATABASE_URL)")
    prune = commands.add_parser("prune", help="delete raw events and sessions before a day")
    prune.add_argument("--before", metavar="YYYY-MM-DD",
                       help="first UTC day kept (default: today minus TALLY_RETENTION_DAYS)")
    customer = commands.add_parser("customer", help="customers").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    erase = customer.add_parser("erase", help="erase a customer's personal data")
    erase.add_argument("--site", required=True, metavar="SITE_ID")
    erase.add_argument("--customer", required=True, metavar="CUSTOMER_ID")
    visitor = commands.add_parser("visitor", help="visitors").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    erase = visitor.add_parser("erase", help="erase a visitor's events, sessions and links")
    erase.add_argument("--site", required=True, metavar="SITE_ID")
    erase.add_argument("--visitor", required=True, metavar="VISITOR_ID",
                       help="a stored visitor id (signed 64-bit decimal) or a tally_vid browser id")
    usage = commands.add_parser("usage", help="an account's counted events in a month")
    usage.add_argument("account_id", metavar="ACCOUNT_ID")
    usage.add_argument("--month", metavar="YYYY-MM", help="UTC month (default: this one)")

    account = commands.add_parser("account", help="accounts and their plans").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = account.add_parser("create", help="create an account")
    create.add_argument("--name", required=True)
    create.add_argument("--plan", default="free", choices=PLAN_NAMES)
    account.add_parser("list", help="list accounts")
    set_plan = account.add_parser("set-plan", help="change an account's plan")
    set_plan.add_argument("account_id", metavar="ACCOUNT_ID")
    set_plan.add_argument("plan", metavar="PLAN", choices=PLAN_NAMES)

    site = commands.add_parser("site", help="sites and their hostnames").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = site.add_parser("create", help="create a site")
    create.add_argument("--account", required=True, metavar="ACCOUNT_ID")
    create.add_argument("--host", required=True, action="append", metavar="HOST")
    listing = site.add_parser("list", help="list sites")
    listing.add_argument("--account", metavar="ACCOUNT_ID")
    identity = site.add_parser(
        "identity-secret", help="make a new identity secret for verified identify; shown once")
    identity.add_argument("--site", required=True, metavar="SITE_ID")

    key = commands.add_parser("key", help="API keys").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = key.add_parser("create", help="create a key; its secret is shown once")
    create.add_argument("--site", required=True, metavar="SITE_ID")
    create.add_argument("--scope", required=True, action="append", choices=SCOPES)
    listing = key.add_parser("list", help="list keys (never their secrets)")
    listing.add_argument("--site", metavar="SITE_ID")
    revoke = key.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key_id", metavar="KEY_ID")

    stripe = commands.add_parser("stripe", help="Stripe webhook secrets").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    set_secret = stripe.add_parser(
        "set-secret", help="set a site's webhook signing secret, read from standard input")
    set_secret.add_argument("--site", required=True, metavar="SITE_ID")
    remove = stripe.add_parser("remove", help="remove a site's webhook signing secret")
    remove.add_argument("--site", required=True, metavar="SITE_ID")
    user = commands.add_parser("user", help="dashboard users").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = user.add_parser("create", help="create a user who sees the sites of the accounts")
    create.add_argument("--email", required=True)
    create.add_argument("--account", required=True, action="append", metavar="ACCOUNT_ID")
    create.add_argument("--role", default="owner", choices=ROLES,
                        help="what the user may do in those accounts (default owner)")
    create.add_argument("--password-stdin", action="store_true", required=True,
                        help="read the password (10 characters or more) from standard input")
    user.add_parser("list", help="list users and their accounts")
    delete = user.add_parser("delete", help="delete a user and end their sessions")
    delete.add_argument("user", metavar="EMAIL_OR_USER_ID")
    set_password = user.add_parser("set-password", help="change a password; ends all sessions")
    set_password.add_argument("user", metavar="EMAIL_OR_USER_ID")
    set_password.add_argument("--password-stdin", action="store_true", required=True,
                              help="read the new password from standard input")

    share = commands.add_parser("share", help="read-only shared dashboard links").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    create = share.add_parser("create", help="make a link; its token is shown once")
    create.add_argument("--site", required=True, metavar="SITE_ID")
    create.add_argument("--revenue", action="store_true", help="show revenue figures too")
    revoke = share.add_parser("revoke", help="revoke a link")
    revoke.add_argument("link", metavar="SHARE_ID_OR_URL")
    listing = share.add_parser("list", help="list links (never their tokens)")
    listing.add_argument("--site", metavar="SITE_ID")

    deadletter = commands.add_parser(
        "deadletter", help="accepted events the flush could not store").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    listing = deadletter.add_parser("list", help="the latest events set aside, with the reason")
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="rows (default 100)")
    if reports:
        _add_report_parsers(commands)
    return parser


def _add_report_parsers(commands) -> None:
    from reports.money.revenue_by import REVENUE_DIMENSIONS
    from reports.segments.filters import COMPARISONS
    from reports.shared.params import BREAKDOWN_DIMENSIONS
    from reports.timeseries import INTERVALS

    report = commands.add_parser("report", help="revenue, MRR and traffic of a site").add_subparsers(
        dest="action", required=True, metavar="REPORT")
    for name, help_text in (
            ("revenue", "revenue per currency, by first-touch channel and by --by"),
            ("mrr", "MRR at a date, and its movements per month"),
            ("traffic", "traffic totals and a breakdown"),
            ("timeseries", "traffic and revenue per hour, day, week or month"),
            ("goals", "custom events with conversions and the revenue of converters"),
            ("funnel", "visitors step by step through a funnel (--steps or --funnel)"),
            ("realtime", "the last 5 and 30 minutes")):
        sub = report.add_parser(name, help=help_text)
        sub.add_argument("--site", required=True, metavar="SITE_ID")
        if name == "realtime":
            continue
        sub.add_argument("--from", dest="from_date", metavar="YYYY-MM-DD",
                         help="first UTC day (default: 29 days before --to)")
        sub.add_argument("--to", dest="to_date", metavar="YYYY-MM-DD",
                         help="last UTC day, inclusive (default: today)")
        if name == "mrr":
            sub.add_argument("--at", metavar="YYYY-MM-DD", help="UTC day (default: today)")
            continue
        sub.add_argument("--filters", metavar="FILTERS",
                         help="e.g. 'visit:source==Google;event:page==/pricing' (see README)")
        if name == "revenue":
            sub.add_argument("--by", default="channel", choices=REVENUE_DIMENSIONS)
        if name == "traffic":
            sub.add_argument("--by", default="channel", choices=BREAKDOWN_DIMENSIONS)
        if name in ("traffic", "goals"):
            sub.add_argument("--limit", default="100", metavar="N", help="rows, 1 to 1000")
        if name == "timeseries":
            sub.add_argument("--interval", default="day", choices=INTERVALS)
        if name in ("traffic", "timeseries"):
            sub.add_argument("--goal", metavar="NAME", help="a custom event, or page:/PATH")
        if name in ("revenue", "traffic", "timeseries"):
            sub.add_argument("--compare", choices=COMPARISONS)
        if name == "funnel":
            sub.add_argument("--steps", metavar="STEPS",
                             help="e.g. 'page:/pricing,goal:Signup,payment' (see README)")
            sub.add_argument("--funnel", metavar="NAME", help="a funnel stored on the site")
        if name in ("revenue", "traffic", "timeseries", "funnel"):
            sub.add_argument("--csv", action="store_true",
                             help="print CSV (for traffic: its breakdown)")


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be between 1 and 64, not {value}")
    return value


# Each handler returns (json_object, human_lines).
Handler = Callable[[argparse.Namespace, "Context"], tuple[dict, list[str]]]
HANDLERS: dict[tuple[str, str | None], Handler] = {}


def command(group: str, action: str | None = None):
    def register(fn: Handler) -> Handler:
        HANDLERS[(group, action)] = fn
        return fn
    return register


class Context:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time):
        self.config = config
        self.clock = clock
        self.db = open_database(config)
        self.directory = Directory(self.db, clock)

    @property
    def users(self):
        from storage.users import Users

        return Users(self.db, self.clock)

    @property
    def shares(self):
        from storage.shares import SharedLinks

        return SharedLinks(self.db, self.clock)


def table(rows: Sequence[dict], columns: Sequence[str]) -> list[str]:
    """Aligned columns for people."""
    cells = [[str(c).upper() for c in columns]]
    for row in rows:
        cells.append([_cell(row.get(c)) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip() for r in cells]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


@command("init")
def _init(args, ctx):
    ctx.db.check_startup()
    version = ctx.db.schema_version()
    return ({"db": ctx.db.location, "ok": True, "schema_version": version},
            [f"database ready at {ctx.db.location} (schema version {version})"])


@command("setup-link")
def _setup_link(args, ctx):
    from dashboard.first_run import setup_url
    from storage.people import SETUP_LINK_MS, People

    token = People(ctx.db, ctx.clock).new_setup_token()
    if token is None:
        raise CliError("this installation has users already: sign in at /login"
                       " (tally user create makes more)")
    url = setup_url(ctx.config.public_url, args.bind, token)
    return ({"url": url, "expires_in_hours": SETUP_LINK_MS // 3_600_000},
            [url, "", "Open it within 24 hours to create the owner and the first site;"
                      " it works once."])


@command("check")
def _check(args, ctx):
    from quota.audit import usage_mismatches
    from storage.check import run_checks

    location = ctx.db.location
    if not ctx.db.exists():
        raise CliError(f"no database at {location}")
    try:
        report = run_checks(ctx.db.conn(), usage_mismatches)
    except ctx.db.DatabaseError as exc:
        raise CliError(f"database {location} cannot be checked: {exc}") from None
    lines = [f"integrity: {'ok' if not report.integrity else '; '.join(report.integrity[:20])}",
             f"foreign key violations: {report.foreign_keys}"]
    if not report.usage_checked:
        lines.append("usage: not checked (no events or usage tables)")
    elif not report.mismatches:
        lines.append(f"usage: ok ({report.months} account-months match the stored events)")
    else:
        lines.append(f"usage: {len(report.mismatches)} mismatches")
        lines += table(report.mismatches, ["account", "month", "usage", "events"])
    if report.dead_letters:
        lines.append(f"dead letters: {report.dead_letters} accepted events could not be stored"
                     " (tally deadletter list)")
    else:
        lines.append("dead letters: none")
    return report.as_json(), lines, 0 if report.ok else 1


@command("backup")
def _backup(args, ctx):
    from storage.maintenance import backup

    result = backup(ctx.db, args.path)
    data = {"path": result.path, "bytes": result.bytes, "user_version": result.user_version,
            "integrity": result.integrity}
    return data, [f"backup written to {result.path} ({result.bytes} bytes, schema version "
                  f"{result.user_version}, integrity {result.integrity})"]


def _usage_after_migration(conn) -> tuple[list[dict], int]:
    return [], 0


@command("restore")
def _restore(args, ctx):
    from quota.audit import usage_mismatches
    from storage.check import run_checks
    from storage.maintenance import connection_as_is, restore

    result = restore(ctx.db, args.backup)
    current = ctx.db.latest_version
    # Usage is counted with this release's statements, which read this release's schema:
    # an older backup's integrity is checked now, its usage by tally check once migrated.
    same = result.user_version == current
    conn = connection_as_is(ctx.db)
    try:
        report = run_checks(conn, usage_mismatches if same else _usage_after_migration)
    except ctx.db.DatabaseError as exc:
        raise CliError(f"restored to {result.location}, but it cannot be checked: {exc}") from None
    finally:
        conn.close()
    report.usage_checked = report.usage_checked and same
    data = {"restored_from": result.source, "db": result.location,
            "user_version": result.user_version, "check": report.as_json()}
    later = (f"; Tally migrates it to version {current} when it next starts (then run"
             " tally check: its usage is checked after the migration)"
             if result.user_version < current else "")
    lines = [f"restored {result.source} to {result.location} (schema version"
             f" {result.user_version}{later})",
             f"check: {'ok' if report.ok else 'PROBLEMS, see tally check'}"]
    return data, lines, 0 if report.ok else 1


@command("migrate-to-postgres")
def _migrate_to_postgres(args, ctx):
    from storage.postgres import PostgresDatabase, redact
    from storage.transfer import migrate_to_postgres

    url = args.to or ctx.config.database_url
    if not url or not url.startswith(("postgresql://", "postgres://")):
        raise CliError("migrate-to-postgres needs --to postgresql://... (or TALLY_DATABASE_URL)")
    source = ctx.config.db_path
    if not os.path.isfile(source):
        raise CliError(f"no database at {source}")
    result = migrate_to_postgres(Database(source, busy_timeout_ms=ctx.config.busy_timeout_ms),
                                 PostgresDatabase(url, busy_timeout_ms=ctx.config.busy_timeout_ms))
    data = {"from": source, "to": redact(url), "rows": result.rows, "tables": result.tables,
            "skipped": result.skipped}
    lines = [f"copied {result.rows} rows in {len(result.tables)} tables from {source}"
             f" to {redact(url)}"]
    lines += table([{"table": t, "rows": n} for t, n in result.tables.items()], ["table", "rows"])
    if result.skipped:
        lines.append(f"not copied (no such table in PostgreSQL): {', '.join(result.skipped)}")
    lines.append("point Tally at it with TALLY_DATABASE_URL and restart")
    return data, lines


@command("prune")
def _prune(args, ctx):
    from datetime import date

    from reports.days.queries import DIMENSIONS
    from reports.days.retention import cutoff_ms, earliest_allowed_cutoff, store_days
    from storage.maintenance import (
        delete_raw_traffic,
        drop_old_months,
        sites_with_raw_traffic,
        unstored_days,
    )

    now_ms = int(ctx.clock() * 1000)
    latest = earliest_allowed_cutoff(now_ms)
    if args.before is not None:
        try:
            before = date.fromisoformat(args.before)
        except ValueError:
            raise CliError(f"--before must be a date YYYY-MM-DD, not {args.before!r}") from None
    elif ctx.config.retention_days is not None:
        before = date.fromordinal(latest.toordinal() + 1 - ctx.config.retention_days)
    else:
        raise CliError("give --before YYYY-MM-DD or set TALLY_RETENTION_DAYS")
    if before > latest:
        raise CliError(f"--before must be {latest.isoformat()} or earlier: later days can still "
                       "change, so their figures cannot be stored yet")
    before_ms = cutoff_ms(before)
    totals = {"events": 0, "sessions": 0, "kept_sessions": 0, "days_stored": 0}
    sites = sites_with_raw_traffic(ctx.db, before_ms)
    for site_id in sites:  # every site's days stored before a whole month of all goes
        missing = unstored_days(ctx.db, site_id, before_ms, len(DIMENSIONS))
        for _ in range(3):  # storing yields to a busy writer; try again
            if not missing:
                break
            store_days(ctx.db, site_id, missing, now_ms)
            totals["days_stored"] += len(missing)
            missing = unstored_days(ctx.db, site_id, before_ms, len(DIMENSIONS))
        if missing:
            raise CliError(f"the traffic of {len(missing)} days could not be stored (database "
                           "busy, or a visit still open); nothing of them was deleted, try again")
    totals["events"] += drop_old_months(ctx.db, before_ms)
    for site_id in sites:
        result = delete_raw_traffic(ctx.db, site_id, before_ms)
        totals["events"] += result.events
        totals["sessions"] += result.sessions
        totals["kept_sessions"] += result.kept_sessions
    data = {"before": before.isoformat(), **totals}
    return data, [f"deleted {totals['events']} events and {totals['sessions']} sessions before "
                  f"{before.isoformat()}; kept {totals['kept_sessions']} first-touch sessions; "
                  f"stored the figures of {totals['days_stored']} days"]


def _site_of(ctx, public_id: str):
    site = ctx.directory.find_site(public_id)
    if site is None:
        raise NotFound(f"no site {public_id}")
    return site


@command("customer", "erase")
def _customer_erase(args, ctx):
    from storage.maintenance import erase_customer

    site = _site_of(ctx, args.site)
    result = erase_customer(ctx.db, site.id, args.customer, int(ctx.clock() * 1000))
    if result is None:
        raise NotFound(f"no customer {args.customer} on site {args.site}")
    data = {"site": args.site, "customer": args.customer,
            "erased": ["email", "name", "metadata", "user_id", "visitor_id"],
            "identity_links": result.identities, "events_user_id_cleared": result.events}
    return data, [f"erased the personal data of customer {args.customer}: email, name, metadata, "
                  f"user id and visitor id; {result.identities} identity links and the user id on "
                  f"{result.events} events. Its payments and subscriptions are kept."]


@command("visitor", "erase")
def _visitor_erase(args, ctx):
    from storage.maintenance import erase_visitor, visitor_id_of

    site = _site_of(ctx, args.site)
    visitor_id = visitor_id_of(ctx.db, site.id, args.visitor)
    result = erase_visitor(ctx.db, site.id, visitor_id, int(ctx.clock() * 1000))
    data = {"site": args.site, "visitor": args.visitor, "events": result.events,
            "sessions": result.sessions, "anonymized_sessions": result.anonymized_sessions,
            "identity_links": result.identities, "customer_links": result.customers}
    return data, [f"erased visitor {args.visitor}: {result.events} events, {result.sessions} "
                  f"sessions, {result.identities} identity links, {result.customers} "
                  f"customer links; {result.anonymized_sessions} first-touch sessions kept "
                  "without the visitor id"]


@command("usage")
def _usage(args, ctx):
    from quota.usage import account_usage, month_of

    report = account_usage(ctx.db, args.account_id, args.month or month_of(ctx.clock()))
    return report, table([report], ["account", "plan", "month", "events", "allowance", "cap"])


@command("account", "create")
def _account_create(args, ctx):
    account = ctx.directory.create_account(args.name, args.plan)
    return account, table([account], ["id", "name", "plan"])


@command("account", "list")
def _account_list(args, ctx):
    accounts = ctx.directory.list_accounts()
    return {"accounts": accounts}, table(accounts, ["id", "name", "plan"])


@command("account", "set-plan")
def _account_set_plan(args, ctx):
    account = ctx.directory.set_plan(args.account_id, args.plan)
    return account, table([account], ["id", "name", "plan"])


@command("site", "create")
def _site_create(args, ctx):
    site = ctx.directory.create_site(args.account, args.host)
    return site, table([site], ["id", "account", "hosts"])


@command("site", "list")
def _site_list(args, ctx):
    sites = ctx.directory.list_sites(args.account)
    return {"sites": sites}, table(sites, ["id", "account", "hosts"])


@command("site", "identity-secret")
def _site_identity_secret(args, ctx):
    import secrets

    from storage.identity_secrets import new_secret, replace_secret

    site = ctx.directory.find_site(args.site)
    if site is None:
        raise NotFound(f"no site {args.site}")
    secret = new_secret(secrets.token_bytes)
    replaced = replace_secret(ctx.db, site.id, secret, int(ctx.clock() * 1000))
    lines = [f"identity secret of {args.site}{' (the old one no longer verifies)' if replaced else ''}:",
             secret, "", "Store it on your server now: it is shown only once."]
    return {"site": args.site, "identity_secret": secret, "replaced": replaced}, lines


@command("key", "create")
def _key_create(args, ctx):
    key = ctx.directory.create_key(args.site, args.scope)
    lines = table([key], ["id", "site", "scopes", "key"])
    return key, lines + ["", "Store this key now: it is shown only once."]


@command("key", "list")
def _key_list(args, ctx):
    keys = ctx.directory.list_keys(args.site)
    return {"keys": keys}, table(keys, ["id", "site", "prefix", "scopes", "created_at", "revoked"])


@command("key", "revoke")
def _key_revoke(args, ctx):
    result = ctx.directory.revoke_key(args.key_id)
    return result, [f"revoked {args.key_id}"]


def _stripe_site(args, ctx):
    site = ctx.directory.find_site(args.site)
    if site is None:
        raise NotFound(f"no site {args.site}")
    return site


@command("stripe", "set-secret")
def _stripe_set_secret(args, ctx):
    import getpass

    from storage.stripe import StripeStore

    site = _stripe_site(args, ctx)
    if sys.stdin.isatty():
        secret = getpass.getpass("Stripe webhook signing secret (whsec_...): ")
    else:
        secret = sys.stdin.readline(STRIPE_SECRET_MAX_CHARS + 2)
    secret = secret.strip()
    if not STRIPE_SECRET.fullmatch(secret):
        # Never echo what was read: it may be a real secret pasted in the wrong place.
        raise CliError("the secret must be the endpoint's signing secret: whsec_ followed by "
                       f"1-{STRIPE_SECRET_MAX_CHARS - 6} letters, digits or +/=_-")
    mark = StripeStore(ctx.db, ctx.clock).set_secret(site.id, secret)
    return ({"site": args.site, "fingerprint": mark},
            [f"Stripe webhook secret set for {args.site} (fingerprint {mark})"])


@command("stripe", "remove")
def _stripe_remove(args, ctx):
    from storage.stripe import StripeStore

    site = _stripe_site(args, ctx)
    removed = StripeStore(ctx.db, ctx.clock).remove_secret(site.id)
    line = "removed" if removed else "had none"
    return {"site": args.site, "removed": removed}, [f"Stripe webhook secret {line}: {args.site}"]
def _read_password() -> str:
    from dashboard import passwords

    line = sys.stdin.readline()
    password = line.removesuffix("\n").removesuffix("\r")
    try:
        passwords.check_strength(password)
    except passwords.WeakPassword as exc:
        raise CliError(str(exc)) from None
    return password


@command("user", "create")
def _user_create(args, ctx):
    from dashboard import passwords

    password_hash = passwords.hash_password(_read_password())
    user = ctx.users.create_user(args.email, password_hash, args.account, args.role)
    return user, table([user], ["id", "email", "accounts"])


@command("user", "list")
def _user_list(args, ctx):
    users = ctx.users.list_users()
    return {"users": users}, table(users, ["id", "email", "accounts", "created_at"])


@command("user", "delete")
def _user_delete(args, ctx):
    result = ctx.users.delete_user(args.user)
    return result, [f"deleted {result['email']} ({result['id']})"]


@command("user", "set-password")
def _user_set_password(args, ctx):
    from dashboard import passwords

    result = ctx.users.set_password_hash(args.user, passwords.hash_password(_read_password()))
    return result, [f"password changed for {result['email']}; "
                    f"{result['sessions_ended']} session(s) ended"]


@command("share", "create")
def _share_create(args, ctx):
    link = ctx.shares.create(args.site, args.revenue)
    url = f"/share/{link['token']}"
    shown = f"{ctx.config.public_url}{url}" if ctx.config.public_url else url
    return {"url": url}, [shown, "", f"Link {link['id']}"
                          f"{' (with revenue)' if args.revenue else ''}: keep the URL now, "
                          "it is shown only once."]


@command("share", "revoke")
def _share_revoke(args, ctx):
    value = args.link.strip()
    token = value.split("/share/", 1)[1].split("?")[0].strip("/") if "/share/" in value else value
    result = ctx.shares.revoke(token)
    return result, [f"revoked {result['id']}"]


@command("share", "list")
def _share_list(args, ctx):
    if args.site is not None and ctx.directory.find_site(args.site) is None:
        raise NotFound(f"no site {args.site}")
    links = ctx.shares.list(args.site)
    return {"links": links}, table(links, ["id", "site", "revenue", "created_at", "revoked"])


@command("deadletter", "list")
def _deadletter_list(args, ctx):
    from storage import deadletters

    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    letters = deadletters.latest(ctx.db.conn(), args.limit)
    total = deadletters.count(ctx.db.conn()) or 0
    shown = [{**letter, "name": letter["event"].get("name"), "url": letter["event"].get("url")}
             for letter in letters]
    lines = [f"{total} events set aside"]
    lines += table(shown, ["id", "site", "month", "set_aside_at", "name", "reason"])
    return {"total": total, "dead_letters": letters}, lines


def _run_reports(args, ctx, *reports: tuple[str, dict]) -> list[dict]:
    """The endpoints' data for the site (money as Decimal), with the endpoints' checks."""
    from reports.service import run_report
    from reports.shared.params import InvalidReportParameter

    site = ctx.directory.find_site(args.site)
    if site is None:
        raise NotFound(f"no site {args.site}")
    now = ctx.clock()
    try:
        return [run_report(name, ctx.db, site.id,
                           {k: v for k, v in params.items() if v is not None}, now,
                           max_delay_seconds=ctx.config.flush_interval)
                for name, params in reports]
    except InvalidReportParameter as exc:
        raise CliError(str(exc)) from None


def _csv_lines(report: str, data: dict) -> list[str]:
    from reports.shared.csv_text import as_csv

    return [as_csv(report, data).removesuffix("\r\n")]


@command("report", "revenue")
def _report_revenue(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import revenue_lines

    (data,) = _run_reports(args, ctx, ("revenue", {
        "from": args.from_date, "to": args.to_date, "by": args.by, "filters": args.filters,
        "compare": args.compare}))
    lines = _csv_lines("revenue", data) if args.csv else revenue_lines(data, table)
    return json_ready(data), lines


@command("report", "mrr")
def _report_mrr(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import mrr_lines

    mrr, movements = _run_reports(args, ctx, ("mrr", {"at": args.at}),
                                  ("movements", {"from": args.from_date, "to": args.to_date}))
    return json_ready({"mrr": mrr, "movements": movements}), mrr_lines(mrr, movements, table)


@command("report", "traffic")
def _report_traffic(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import traffic_lines

    period = {"from": args.from_date, "to": args.to_date, "filters": args.filters,
              "goal": args.goal}
    aggregate, breakdown = _run_reports(
        args, ctx, ("aggregate", {**period, "compare": args.compare}),
        ("breakdown", {**period, "by": args.by, "limit": args.limit}))
    result = {"aggregate": aggregate, "breakdown": breakdown}
    lines = _csv_lines("breakdown", breakdown) if args.csv \
        else traffic_lines(aggregate, breakdown, table)
    return json_ready(result), lines


@command("report", "timeseries")
def _report_timeseries(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import timeseries_lines

    (data,) = _run_reports(args, ctx, ("timeseries", {
        "from": args.from_date, "to": args.to_date, "interval": args.interval,
        "filters": args.filters, "goal": args.goal, "compare": args.compare}))
    lines = _csv_lines("timeseries", data) if args.csv else timeseries_lines(data, table)
    return json_ready(data), lines


@command("report", "goals")
def _report_goals(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import goals_lines

    (data,) = _run_reports(args, ctx, ("goals", {
        "from": args.from_date, "to": args.to_date, "filters": args.filters,
        "limit": args.limit}))
    return json_ready(data), goals_lines(data, table)


@command("report", "funnel")
def _report_funnel(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import funnel_lines

    (data,) = _run_reports(args, ctx, ("funnel", {
        "from": args.from_date, "to": args.to_date, "filters": args.filters,
        "steps": args.steps, "funnel": args.funnel}))
    lines = _csv_lines("funnel", data) if args.csv else funnel_lines(data, table)
    return json_ready(data), lines


@command("report", "realtime")
def _report_realtime(args, ctx):
    from reports.money.amounts import json_ready
    from reports.shared.text import realtime_lines

    (data,) = _run_reports(args, ctx, ("realtime", {}))
    return json_ready(data), realtime_lines(data, table)


def _may_be_a_report(argv: Sequence[str]) -> bool:
    """False when the first word that is not an option names a command other than report
    (its parser then leaves the reports' modules unimported); otherwise the whole parser,
    whose help and errors list every command."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first is None or first == "report" or first not in _OTHER_COMMANDS


_OTHER_COMMANDS = frozenset((
    "init", "serve", "setup-link", "check", "backup", "restore", "migrate-to-postgres", "prune",
    "customer", "visitor", "usage", "account", "site", "key", "stripe", "user", "share",
    "deadletter"))


def _operator_errors() -> tuple[type[BaseException], ...]:
    """What a command reports on one line with status 1. MaintenanceError is among them
    once its module is loaded: a command that never imported it cannot raise it."""
    errors = (CliError, NotFound, InvalidArgument, ConfigError, StorageError)
    maintenance = sys.modules.get("storage.maintenance")
    return (*errors, maintenance.MaintenanceError) if maintenance else errors


def main(argv: Sequence[str] | None = None, *, context: Context | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --json is accepted anywhere on the line, before or after the command.
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    args = build_parser(reports=_may_be_a_report(argv)).parse_args(argv)
    if args.group == "serve":
        from serving import serve

        serve(args.bind, args.workers)  # gunicorn's master exits the process itself on errors
        return 0
    try:
        ctx = context or Context(Config.from_env())
        handler = HANDLERS[(args.group, getattr(args, "action", None))]
        # A handler may add an exit status: (json_object, human_lines, status).
        result, lines, *status = handler(args, ctx)
    except Exception as exc:
        if isinstance(exc, _operator_errors()):
            print(f"tally: {exc}", file=sys.stderr)
            return 1
        # A bug or bad stored data: one line for the operator, no traceback.
        print(f"tally: {args.group} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    else:
        print("\n".join(lines))
    return status[0] if status else 0


if __name__ == "__main__":
    sys.exit(main())
