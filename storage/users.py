"""Dashboard users, the accounts they may see, their sign-in sessions, failed sign-ins, the
addresses they signed in from and the key of the sign-in form's CSRF tokens.

Passwords arrive here already hashed (dashboard/passwords.py); session ids arrive as
SHA-256 digests, so the table holds nothing a stolen copy could sign in with.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from storage.db import Database
from storage.directory import InvalidArgument, NotFound, _iso
from storage.statements import statement

_EMAIL = re.compile(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+")


_USER_WITH_EMAIL = statement("SELECT 1 FROM users WHERE email = ?")
_ACCOUNT_ID = statement("SELECT id FROM accounts WHERE public_id = ?")
_INSERT_USER = statement(
    "INSERT INTO users (public_id, email, password_hash, created_at)"
    " VALUES (?, ?, ?, ?) RETURNING id")
_USERS = statement(
    "SELECT id, public_id, email, created_at FROM users ORDER BY id")
_FIND_USER = statement(
    "SELECT id, public_id, email, password_hash FROM users"
    " WHERE email = ? OR public_id = ?")
_DELETE_SESSIONS_OF_USER = statement("DELETE FROM user_sessions WHERE user_id = ?")
_DELETE_ADDRESSES_OF_USER = statement("DELETE FROM sign_in_addresses WHERE user_id = ?")
_DELETE_ACCOUNTS_OF_USER = statement("DELETE FROM user_accounts WHERE user_id = ?")
_DELETE_USER = statement("DELETE FROM users WHERE id = ?")
_SET_PASSWORD_HASH = statement("UPDATE users SET password_hash = ? WHERE id = ?")
_REPLACE_HASH = statement("UPDATE users SET password_hash = ? WHERE id = ? AND password_hash = ?")
_DELETE_EXPIRED_SESSIONS = statement("DELETE FROM user_sessions WHERE expires_at <= ?")
_INSERT_SESSION = statement(
    "INSERT INTO user_sessions (id_hash, user_id, csrf_token, created_at, expires_at)"
    " VALUES (?, ?, ?, ?, ?)")
_LIVE_SESSION = statement(
    "SELECT s.user_id, u.email, s.csrf_token, s.expires_at FROM user_sessions s"
    " JOIN users u ON u.id = s.user_id WHERE s.id_hash = ? AND s.expires_at > ?")
_END_SESSION = statement("DELETE FROM user_sessions WHERE id_hash = ?")
_INSERT_FAILURE = statement(
    "INSERT INTO login_failures (email, client_ip, at_ms) VALUES (?, ?, ?)")
_DELETE_OLD_FAILURES = statement("DELETE FROM login_failures WHERE at_ms < ?")
_FAILURES_OF_PAIR = statement(
    "SELECT count(*), min(at_ms) FROM login_failures"
    " WHERE email = ? AND client_ip = ? AND at_ms >= ?")
_FAILURES_FROM_ADDRESS = statement(
    "SELECT count(*), min(at_ms) FROM login_failures WHERE client_ip = ? AND at_ms >= ?")
_FAILURES_OF_EMAIL = statement(
    "SELECT count(*), min(at_ms) FROM login_failures WHERE email = ? AND at_ms >= ?")
_CLEAR_FAILURES = statement("DELETE FROM login_failures WHERE email = ? AND client_ip = ?")
_UPSERT_ADDRESS = statement(
    "INSERT INTO sign_in_addresses (user_id, address, last_at) VALUES (?, ?, ?)"
    " ON CONFLICT (user_id, address) DO UPDATE SET last_at = excluded.last_at")
_DELETE_OLD_ADDRESSES = statement(
    "DELETE FROM sign_in_addresses WHERE user_id = ? AND last_at < ?")
_KNOWN_ADDRESS = statement(
    "SELECT 1 FROM sign_in_addresses WHERE user_id = ? AND address = ? AND last_at >= ?")
_SIGN_IN_KEY = statement("SELECT key FROM sign_in_key WHERE id = 1")
_INSERT_SIGN_IN_KEY = statement(
    "INSERT INTO sign_in_key (id, key, created_at) VALUES (1, ?, ?)"
    " ON CONFLICT (id) DO NOTHING")


_INSERT_USER_ACCOUNT = statement(
    "INSERT INTO user_accounts (user_id, account_id, role) VALUES (?, ?, ?)")
_MEMBERSHIPS_OF_USER = statement(
    "SELECT a.public_id, ua.role FROM user_accounts ua"
    " JOIN accounts a ON a.id = ua.account_id"
    " WHERE ua.user_id = ? ORDER BY a.public_id")
_ROLES_OF_USER = statement(
    "SELECT account_id, role FROM user_accounts WHERE user_id = ? ORDER BY account_id")
_SITES_OF_ACCOUNTS = statement(
    "SELECT s.id, s.public_id, a.public_id, a.name, a.id FROM sites s"
    " JOIN accounts a ON a.id = s.account_id"
    " WHERE s.account_id IN (SELECT value FROM json_each(?)) ORDER BY s.id")
_HOSTS_OF_SITE = statement(
    "SELECT host FROM site_hosts WHERE site_id = ? ORDER BY host")
_ACCOUNTS_BY_NAME = statement(
    "SELECT id, public_id, name FROM accounts WHERE id IN (SELECT value FROM json_each(?))"
    " ORDER BY name, id")


@dataclass(frozen=True)
class UserRecord:
    id: int
    public_id: str
    email: str
    password_hash: str


@dataclass(frozen=True)
class SignedIn:
    """A live sign-in session: who, which accounts (integer ids) with the role in each
    (owner, admin, viewer: storage/people.py), and its CSRF token."""

    user_id: int
    email: str
    account_ids: frozenset[int]
    csrf_token: str
    expires_at: int
    roles: tuple[tuple[int, str], ...] = ()

    def role_in(self, account_id: int) -> str | None:
        return dict(self.roles).get(account_id)

    def manages(self, account_id: int) -> bool:
        """May change the account's sites, hostnames, keys and shared links."""
        return self.role_in(account_id) in ("owner", "admin")

    @property
    def owns_any(self) -> bool:
        return any(role == "owner" for _, role in self.roles)

    @property
    def manages_any(self) -> bool:
        return any(role in ("owner", "admin") for _, role in self.roles)


@dataclass(frozen=True)
class Failures:
    """(count, earliest at_ms or None) of failed sign-ins in a window, three ways."""

    pair: tuple[int, int | None]  # this email from this address
    address: tuple[int, int | None]  # from this address, any email
    email: tuple[int, int | None]  # this email, from anywhere


def normalize_email(email: str) -> str:
    value = email.strip().lower()
    if len(value) > 254 or not _EMAIL.fullmatch(value):
        raise InvalidArgument(f"invalid email {email!r}")
    return value


class Users:
    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # users -----------------------------------------------------------------
    def create_user(self, email: str, password_hash: str, account_ids: Iterable[str],
                    role: str = "owner") -> dict:
        email = normalize_email(email)
        accounts = sorted(set(account_ids))
        if not accounts:
            raise InvalidArgument("give at least one --account")
        public_id = "user_" + base64.b32encode(self.random_bytes(10)).decode("ascii").lower()
        with self.db.transaction() as conn:
            if conn.execute(_USER_WITH_EMAIL, (email,)).fetchone():
                raise InvalidArgument(f"a user with email {email} exists")
            ids = []
            for account in accounts:
                row = conn.execute(_ACCOUNT_ID,
                                   (account,)).fetchone()
                if row is None:
                    raise NotFound(f"no account {account}")
                ids.append(row[0])
            user_id = conn.execute(
                _INSERT_USER,
                (public_id, email, password_hash, self._now_ms())).fetchone()[0]
            conn.executemany(
                _INSERT_USER_ACCOUNT,
                [(user_id, account_id, role) for account_id in ids])
        return {"id": public_id, "email": email, "accounts": accounts}

    def list_users(self) -> list[dict]:
        conn = self.db.conn()
        users = conn.execute(_USERS)
        result = []
        for user_id, public_id, email, created_at in users.fetchall():
            memberships = conn.execute(
                _MEMBERSHIPS_OF_USER, (user_id,)).fetchall()
            result.append({"id": public_id, "email": email,
                           "accounts": [account for account, _ in memberships],
                           "roles": {account: role for account, role in memberships},
                           "created_at": _iso(created_at)})
        return result

    def find_user(self, email_or_id: str) -> UserRecord | None:
        value = email_or_id.strip()
        column_value = value.lower() if "@" in value else value
        row = self.db.conn().execute(
            _FIND_USER, (column_value, column_value)).fetchone()
        return None if row is None else UserRecord(*row)

    def _require(self, email_or_id: str) -> UserRecord:
        user = self.find_user(email_or_id)
        if user is None:
            raise NotFound(f"no user {email_or_id}")
        return user

    def delete_user(self, email_or_id: str) -> dict:
        user = self._require(email_or_id)
        with self.db.transaction() as conn:
            conn.execute(_DELETE_SESSIONS_OF_USER, (user.id,))
            conn.execute(_DELETE_ADDRESSES_OF_USER, (user.id,))
            conn.execute(_DELETE_ACCOUNTS_OF_USER, (user.id,))
            conn.execute(_DELETE_USER, (user.id,))
        return {"id": user.public_id, "email": user.email, "deleted": True}

    def set_password_hash(self, email_or_id: str, password_hash: str) -> dict:
        """A new password ends every session the user had."""
        user = self._require(email_or_id)
        with self.db.transaction() as conn:
            conn.execute(_SET_PASSWORD_HASH,
                         (password_hash, user.id))
            ended = conn.execute(_DELETE_SESSIONS_OF_USER,
                                 (user.id,)).rowcount
        return {"id": user.public_id, "email": user.email, "sessions_ended": ended}

    def replace_hash(self, user_id: int, old_hash: str, new_hash: str) -> None:
        """A stronger hash of the same password, written only if nothing changed it since."""
        with self.db.transaction() as conn:
            conn.execute(_REPLACE_HASH,
                         (new_hash, user_id, old_hash))

    # sessions --------------------------------------------------------------
    def start_session(self, user_id: int, id_hash: bytes, csrf_token: str,
                      lifetime_ms: int) -> int:
        now = self._now_ms()
        with self.db.transaction() as conn:
            conn.execute(_DELETE_EXPIRED_SESSIONS, (now,))
            conn.execute(
                _INSERT_SESSION, (id_hash, user_id, csrf_token, now, now + lifetime_ms))
        return now + lifetime_ms

    def find_session(self, id_hash: bytes) -> SignedIn | None:
        conn = self.db.conn()
        row = conn.execute(
            _LIVE_SESSION,
            (id_hash, self._now_ms())).fetchone()
        if row is None:
            return None
        roles = tuple((r[0], r[1]) for r in conn.execute(
            _ROLES_OF_USER,
            (row[0],)))
        return SignedIn(row[0], row[1], frozenset(a for a, _ in roles), row[2], row[3], roles)

    def end_session(self, id_hash: bytes) -> None:
        with self.db.transaction() as conn:
            conn.execute(_END_SESSION, (id_hash,))

    def sites_of(self, account_ids: Iterable[int]) -> list[dict]:
        """The sites of these accounts: public id, account public id and hostnames."""
        conn = self.db.conn()
        wanted = sorted(set(account_ids))
        rows = conn.execute(
            _SITES_OF_ACCOUNTS,
            (_json_list(wanted),)).fetchall()
        return [{"row_id": site_id, "id": public_id, "account": account, "account_name": name,
                 "account_row_id": account_row_id,
                 "hosts": [r[0] for r in conn.execute(
                     _HOSTS_OF_SITE, (site_id,))]}
                for site_id, public_id, account, name, account_row_id in rows]

    def accounts_of(self, account_ids: Iterable[int]) -> list[dict]:
        """These accounts' row id, public id and name, by name."""
        rows = self.db.conn().execute(
            _ACCOUNTS_BY_NAME, (_json_list(sorted(set(account_ids))),))
        return [{"row_id": r[0], "id": r[1], "name": r[2]} for r in rows]

    # failed sign-ins ---------------------------------------------------------
    def record_failure(self, email: str, address: str) -> None:
        """address: the client's address block (api.client_ip.address_block)."""
        now = self._now_ms()
        with self.db.transaction() as conn:
            conn.execute(_INSERT_FAILURE,
                         (email, address, now))
            # Rows older than a day tell nothing any more.
            conn.execute(_DELETE_OLD_FAILURES, (now - 86_400_000,))

    def failures_since(self, email: str, address: str, since_ms: int) -> Failures:
        """Failed sign-ins since then: for the email from the address, from the address
        (any email), for the email (any address); each with its earliest time."""
        conn = self.db.conn()
        pair = conn.execute(
            _FAILURES_OF_PAIR,
            (email, address, since_ms)).fetchone()
        by_address = conn.execute(
            _FAILURES_FROM_ADDRESS,
            (address, since_ms)).fetchone()
        by_email = conn.execute(
            _FAILURES_OF_EMAIL,
            (email, since_ms)).fetchone()
        return Failures(tuple(pair), tuple(by_address), tuple(by_email))

    def clear_failures(self, email: str, address: str) -> None:
        """A successful sign-in forgets that address's failures for the email (only those:
        others' count on)."""
        with self.db.transaction() as conn:
            conn.execute(_CLEAR_FAILURES,
                         (email, address))

    # addresses a user signed in from -----------------------------------------------
    def remember_address(self, user_id: int, address: str, forget_before_ms: int) -> None:
        now = self._now_ms()
        with self.db.transaction() as conn:
            conn.execute(
                _UPSERT_ADDRESS,
                (user_id, address, now))
            conn.execute(_DELETE_OLD_ADDRESSES,
                         (user_id, forget_before_ms))

    def known_address(self, user_id: int, address: str, since_ms: int) -> bool:
        return self.db.conn().execute(
            _KNOWN_ADDRESS,
            (user_id, address, since_ms)).fetchone() is not None

    def sign_in_key(self) -> bytes:
        """The installation's key for sign-in CSRF tokens, made on first use (the first
        writer wins)."""
        conn = self.db.conn()
        row = conn.execute(_SIGN_IN_KEY).fetchone()
        if row is None:
            with self.db.transaction() as conn:
                conn.execute(_INSERT_SIGN_IN_KEY,
                             (self.random_bytes(32), self._now_ms()))
            row = self.db.conn().execute(_SIGN_IN_KEY).fetchone()
        return bytes(row[0])


def _json_list(values: list[int]) -> str:
    return "[" + ",".join(str(int(v)) for v in values) + "]"
