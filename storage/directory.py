"""Accounts, sites and API keys: who may send what to which site."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from storage.db import Database
from storage.statements import statement
from vocabulary import PLAN_NAMES, SCOPES

KEY_PREFIX = "tly_"
# tly_ followed by 32 random bytes in unpadded base64url (256 bits).
KEY_PATTERN = re.compile(r"tly_[A-Za-z0-9_-]{43}")
_HOST_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


_CREATE_ACCOUNT = statement(
    "INSERT INTO accounts (public_id, name, plan, created_at) VALUES (?, ?, ?, ?)")
_LIST_ACCOUNTS = statement("SELECT public_id, name, plan FROM accounts ORDER BY id")
_GET_ACCOUNT = statement("SELECT public_id, name, plan FROM accounts WHERE public_id = ?")
_SET_PLAN = statement("UPDATE accounts SET plan = ? WHERE public_id = ?")
_ACCOUNT_ID = statement("SELECT id FROM accounts WHERE public_id = ?")
_INSERT_SITE = statement(
    "INSERT INTO sites (public_id, account_id, created_at) VALUES (?, ?, ?) RETURNING id")
_INSERT_SITE_HOST = statement("INSERT INTO site_hosts (site_id, host) VALUES (?, ?)")
_LIST_SITES = statement(
    "SELECT s.id, s.public_id, a.public_id FROM sites s JOIN accounts a ON a.id = s.account_id"
    " WHERE ? IS NULL OR a.public_id = ? ORDER BY s.id")
_FIND_SITE = statement(
    "SELECT s.id, s.public_id, a.id, a.public_id, a.plan"
    " FROM sites s JOIN accounts a ON a.id = s.account_id WHERE s.public_id = ?")
_SITE_ID = statement("SELECT id FROM sites WHERE public_id = ?")
_INSERT_KEY = statement(
    "INSERT INTO api_keys (public_id, site_id, secret_hash, prefix, scopes, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?)")
_LIST_KEYS = statement(
    "SELECT k.public_id, s.public_id, k.prefix, k.scopes, k.created_at, k.revoked_at"
    " FROM api_keys k JOIN sites s ON s.id = k.site_id"
    " WHERE ? IS NULL OR s.public_id = ? ORDER BY k.id")
_KEY_REVOKED_AT = statement("SELECT revoked_at FROM api_keys WHERE public_id = ?")
_REVOKE_KEY = statement("UPDATE api_keys SET revoked_at = ? WHERE public_id = ?")
_FIND_KEY = statement(
    "SELECT k.public_id, k.site_id, s.public_id, k.scopes, k.revoked_at, k.secret_hash"
    " FROM api_keys k JOIN sites s ON s.id = k.site_id WHERE k.secret_hash = ?")
_SITE_HOSTS = statement("SELECT host FROM site_hosts WHERE site_id = ? ORDER BY host")


class NotFound(LookupError):
    """No account, site or key has that id."""


class InvalidArgument(ValueError):
    """A value given to the directory breaks its rules."""


@dataclass(frozen=True)
class KeyRecord:
    public_id: str
    site_id: int
    site_public_id: str
    scopes: frozenset[str]
    revoked: bool


@dataclass(frozen=True)
class SiteRecord:
    id: int
    public_id: str
    account_id: int
    account_public_id: str
    plan: str
    hosts: frozenset[str]


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def normalize_host(host: str) -> str:
    value = host.strip().lower().rstrip(".")
    labels = value.split(".")
    if not value or len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidArgument(f"invalid host {host!r}: give a bare hostname such as example.com")
    return value


class Directory:
    def __init__(
        self,
        db: Database,
        clock: Callable[[], float],
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
    ):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes

    # ids ---------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return prefix + base64.b32encode(self.random_bytes(10)).decode("ascii").lower()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # accounts ------------------------------------------------------------
    def create_account(self, name: str, plan: str = "free") -> dict:
        name = name.strip()
        if not 1 <= len(name) <= 200:
            raise InvalidArgument("account name must be 1 to 200 characters")
        _check_plan(plan)
        public_id = self._new_id("acct_")
        with self.db.transaction() as conn:
            conn.execute(
                _CREATE_ACCOUNT,
                (public_id, name, plan, self._now_ms()),
            )
        return {"id": public_id, "name": name, "plan": plan}

    def list_accounts(self) -> list[dict]:
        rows = self.db.conn().execute(_LIST_ACCOUNTS)
        return [{"id": r[0], "name": r[1], "plan": r[2]} for r in rows]

    def get_account(self, account_id: str) -> dict:
        row = (
            self.db.conn()
            .execute(_GET_ACCOUNT, (account_id,))
            .fetchone()
        )
        if row is None:
            raise NotFound(f"no account {account_id}")
        return {"id": row[0], "name": row[1], "plan": row[2]}

    def set_plan(self, account_id: str, plan: str) -> dict:
        _check_plan(plan)
        with self.db.transaction() as conn:
            cursor = conn.execute(
                _SET_PLAN, (plan, account_id)
            )
            if cursor.rowcount == 0:
                raise NotFound(f"no account {account_id}")
        return self.get_account(account_id)

    # sites ---------------------------------------------------------------
    def create_site(self, account_id: str, hosts: Iterable[str]) -> dict:
        normalized = sorted({normalize_host(h) for h in hosts})
        if not normalized:
            raise InvalidArgument("a site needs at least one --host")
        public_id = self._new_id("site_")
        with self.db.transaction() as conn:
            row = conn.execute(
                _ACCOUNT_ID, (account_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no account {account_id}")
            site_id = conn.execute(
                _INSERT_SITE,
                (public_id, row[0], self._now_ms()),
            ).fetchone()[0]
            conn.executemany(
                _INSERT_SITE_HOST,
                [(site_id, host) for host in normalized],
            )
        return {"id": public_id, "account": account_id, "hosts": normalized}

    def list_sites(self, account_id: str | None = None) -> list[dict]:
        conn = self.db.conn()
        if account_id is not None:
            self.get_account(account_id)
        rows = conn.execute(
            _LIST_SITES,
            (account_id, account_id),
        ).fetchall()
        return [
            {"id": public_id, "account": account, "hosts": self._hosts(conn, site_id)}
            for site_id, public_id, account in rows
        ]

    def find_site(self, public_id: str) -> SiteRecord | None:
        """The site, or None when there is none; a busy database raises StorageBusy (never
        None: "no such site" must not stand for "could not look")."""
        with self.db.storage_errors():
            conn = self.db.conn()
            row = conn.execute(
                _FIND_SITE,
                (public_id,),
            ).fetchone()
            if row is None:
                return None
            return SiteRecord(*row, hosts=frozenset(self._hosts(conn, row[0])))

    @staticmethod
    def _hosts(conn: sqlite3.Connection, site_id: int) -> list[str]:
        return site_hosts(conn, site_id)

    # keys ----------------------------------------------------------------
    def create_key(self, site_id: str, scopes: Iterable[str]) -> dict:
        chosen = sorted(set(scopes))
        unknown = [s for s in chosen if s not in SCOPES]
        if unknown or not chosen:
            raise InvalidArgument(f"--scope must be one of {', '.join(SCOPES)}")
        secret = KEY_PREFIX + base64.urlsafe_b64encode(self.random_bytes(32)).decode().rstrip("=")
        public_id = self._new_id("key_")
        with self.db.transaction() as conn:
            row = conn.execute(_SITE_ID, (site_id,)).fetchone()
            if row is None:
                raise NotFound(f"no site {site_id}")
            conn.execute(
                _INSERT_KEY,
                (public_id, row[0], hash_secret(secret), secret[:8], ",".join(chosen), self._now_ms()),
            )
        return {"id": public_id, "key": secret, "site": site_id, "scopes": chosen}

    def list_keys(self, site_id: str | None = None) -> list[dict]:
        if site_id is not None and self.find_site(site_id) is None:
            raise NotFound(f"no site {site_id}")
        rows = self.db.conn().execute(
            _LIST_KEYS,
            (site_id, site_id),
        )
        return [
            {
                "id": r[0],
                "site": r[1],
                "prefix": r[2],
                "scopes": r[3].split(","),
                "created_at": _iso(r[4]),
                "revoked": r[5] is not None,
            }
            for r in rows
        ]

    def revoke_key(self, key_id: str) -> dict:
        with self.db.transaction() as conn:
            row = conn.execute(
                _KEY_REVOKED_AT, (key_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no key {key_id}")
            if row[0] is None:
                conn.execute(
                    _REVOKE_KEY,
                    (self._now_ms(), key_id),
                )
        return {"id": key_id, "revoked": True}

    def find_key(self, secret_hash: bytes) -> KeyRecord | None:
        """The key, or None when no key has that hash; a busy or unreachable database raises
        StorageBusy (a 503 to retry), never None, which would refuse a valid key 401."""
        with self.db.storage_errors():
            row = self.db.conn().execute(
                _FIND_KEY,
                (secret_hash,),
            ).fetchone()
        if row is None or not secrets.compare_digest(row[5], secret_hash):
            return None
        return KeyRecord(row[0], row[1], row[2], frozenset(row[3].split(",")), row[4] is not None)


def site_hosts(conn: sqlite3.Connection, site_id: int) -> list[str]:
    """The site's hostnames, sorted."""
    rows = conn.execute(_SITE_HOSTS, (site_id,))
    return [r[0] for r in rows]


def _check_plan(plan: str) -> None:
    if plan not in PLAN_NAMES:
        raise InvalidArgument(f"plan must be one of {', '.join(PLAN_NAMES)}")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z"
    )
