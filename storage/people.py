"""Who may do what: the first run's one-time setup links, members' roles in their accounts,
and invitations by one-time link. Tokens are stored as SHA-256 digests (hash_secret)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from storage.db import Database
from storage.directory import InvalidArgument, NotFound, _iso, hash_secret, normalize_host
from storage.statements import statement
from storage.users import normalize_email

ROLES = ("owner", "admin", "viewer")
SETUP_LINK_MS = 24 * 3_600_000
INVITATION_MS = 7 * 86_400_000


_HAS_USERS = statement("SELECT 1 FROM users LIMIT 1")
_DELETE_EXPIRED_SETUP_TOKENS = statement("DELETE FROM setup_tokens WHERE expires_at <= ?")
_INSERT_SETUP_TOKEN = statement(
    "INSERT INTO setup_tokens (token_hash, created_at, expires_at)"
    " VALUES (?, ?, ?)")
_SETUP_OPEN = statement(
    "SELECT 1 FROM setup_tokens WHERE token_hash = ? AND expires_at > ?"
    " AND NOT EXISTS (SELECT 1 FROM users)")
_INSERT_ACCOUNT = statement(
    "INSERT INTO accounts (public_id, name, created_at) VALUES (?, ?, ?) RETURNING id")
_INSERT_SITE = statement(
    "INSERT INTO sites (public_id, account_id, created_at) VALUES (?, ?, ?)"
    " RETURNING id")
_INSERT_SITE_HOST = statement(
    "INSERT INTO site_hosts (site_id, host) VALUES (?, ?)")
_INSERT_USER = statement(
    "INSERT INTO users (public_id, email, password_hash, created_at)"
    " VALUES (?, ?, ?, ?) RETURNING id")
_INSERT_MEMBERSHIP = statement(
    "INSERT INTO user_accounts (user_id, account_id, role) VALUES (?, ?, ?)")
_DELETE_SETUP_TOKENS = statement("DELETE FROM setup_tokens")
_MEMBERS = statement(
    "SELECT u.public_id, u.email, ua.role, u.created_at FROM user_accounts ua"
    " JOIN users u ON u.id = ua.user_id WHERE ua.account_id = ? ORDER BY u.email")
_ACCOUNT_NAME = statement("SELECT name FROM accounts WHERE id = ?")
_MEMBER = statement(
    "SELECT ua.user_id, ua.role FROM user_accounts ua JOIN users u ON u.id = ua.user_id"
    " WHERE ua.account_id = ? AND u.public_id = ?")
_OWNER_COUNT = statement(
    "SELECT count(*) FROM user_accounts WHERE account_id = ? AND role = 'owner'")
_DELETE_MEMBER = statement(
    "DELETE FROM user_accounts WHERE account_id = ? AND user_id = ?")
_SET_ROLE = statement(
    "UPDATE user_accounts SET role = ? WHERE account_id = ? AND user_id = ?")
_INSERT_INVITATION = statement(
    "INSERT INTO invitations (public_id, account_id, role, token_hash, invited_by,"
    " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
_PENDING_INVITATIONS = statement(
    "SELECT public_id, role, created_at, expires_at FROM invitations"
    " WHERE account_id = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?"
    " ORDER BY id")
_REVOKE_INVITATION = statement(
    "UPDATE invitations SET revoked_at = ? WHERE account_id = ? AND public_id = ?"
    " AND used_at IS NULL AND revoked_at IS NULL")
_USER_WITH_EMAIL = statement("SELECT 1 FROM users WHERE email = ?")
_ADD_MEMBERSHIP = statement(
    "INSERT INTO user_accounts (user_id, account_id, role) VALUES (?, ?, ?)"
    " ON CONFLICT (user_id, account_id) DO NOTHING")
_MARK_INVITATION_USED = statement("UPDATE invitations SET used_at = ? WHERE id = ?")


@dataclass(frozen=True)
class Invitation:
    public_id: str
    account_id: int
    account_name: str
    role: str


class SetupClosed(LookupError):
    """The setup link is unknown, expired, or the installation has a user already."""


class People:
    def __init__(self, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes):
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _token(self) -> str:
        return base64.urlsafe_b64encode(self.random_bytes(32)).decode("ascii").rstrip("=")

    def _new_id(self, prefix: str) -> str:
        return prefix + base64.b32encode(self.random_bytes(10)).decode("ascii").lower()

    # first run -------------------------------------------------------------------
    def has_users(self) -> bool:
        return self.db.conn().execute(_HAS_USERS).fetchone() is not None

    def new_setup_token(self) -> str | None:
        """A new one-time setup token valid for 24 hours; None when a user exists (the
        installation is set up: people sign in)."""
        token = self._token()
        now = self._now_ms()
        with self.db.transaction() as conn:
            if conn.execute(_HAS_USERS).fetchone() is not None:
                return None
            conn.execute(_DELETE_EXPIRED_SETUP_TOKENS, (now,))
            conn.execute(_INSERT_SETUP_TOKEN, (hash_secret(token), now, now + SETUP_LINK_MS))
        return token

    def setup_open(self, token: str) -> bool:
        return self._setup_open(self.db.conn(), token)

    def _setup_open(self, conn, token: str) -> bool:
        return conn.execute(
            _SETUP_OPEN,
            (hash_secret(token), self._now_ms())).fetchone() is not None

    def complete_setup(self, token: str, *, email: str, password_hash: str, host: str,
                       account_name: str) -> dict:
        """The account, its owner and its first site, in one transaction that spends every
        setup token. Raises SetupClosed (nothing written) or InvalidArgument."""
        email = normalize_email(email)
        host = normalize_host(host)
        name = account_name.strip() or host
        if len(name) > 200:
            raise InvalidArgument("the account name must be 200 characters or fewer")
        now = self._now_ms()
        account_public, site_public = self._new_id("acct_"), self._new_id("site_")
        user_public = self._new_id("user_")
        with self.db.transaction() as conn:
            if not self._setup_open(conn, token):
                raise SetupClosed("this setup link is no longer valid")
            account = conn.execute(
                _INSERT_ACCOUNT,
                (account_public, name, now)).fetchone()[0]
            site = conn.execute(
                _INSERT_SITE, (site_public, account, now)).fetchone()[0]
            conn.execute(_INSERT_SITE_HOST, (site, host))
            user = conn.execute(
                _INSERT_USER,
                (user_public, email, password_hash, now)).fetchone()[0]
            conn.execute(_INSERT_MEMBERSHIP,
                         (user, account, "owner"))
            conn.execute(_DELETE_SETUP_TOKENS)
        return {"user_id": user, "account": account_public, "site": site_public, "host": host}

    # members ---------------------------------------------------------------------
    def members(self, account_id: int) -> list[dict]:
        rows = self.db.conn().execute(
            _MEMBERS,
            (account_id,))
        return [{"id": r[0], "email": r[1], "role": r[2], "since": _iso(r[3])[:10]} for r in rows]

    def account_name(self, account_id: int) -> str | None:
        row = self.db.conn().execute(_ACCOUNT_NAME,
                                     (account_id,)).fetchone()
        return None if row is None else row[0]

    def set_role(self, account_id: int, user_public_id: str, role: str) -> None:
        self._change_member(account_id, user_public_id, role)

    def remove_member(self, account_id: int, user_public_id: str) -> None:
        self._change_member(account_id, user_public_id, None)

    def _change_member(self, account_id: int, user_public_id: str, role: str | None) -> None:
        """A new role, or None: no longer a member. An account keeps at least one owner."""
        if role is not None and role not in ROLES:
            raise InvalidArgument(f"role must be one of {', '.join(ROLES)}")
        with self.db.transaction() as conn:
            row = conn.execute(
                _MEMBER,
                (account_id, user_public_id)).fetchone()
            if row is None:
                raise NotFound("no such member")
            owners = conn.execute(
                _OWNER_COUNT,
                (account_id,)).fetchone()[0]
            if row[1] == "owner" and role != "owner" and owners == 1:
                raise InvalidArgument("an account needs an owner: make someone else owner first")
            if role is None:
                conn.execute(_DELETE_MEMBER,
                             (account_id, row[0]))
            else:
                conn.execute(_SET_ROLE,
                             (role, account_id, row[0]))

    # invitations -------------------------------------------------------------------
    def invite(self, account_id: int, role: str, invited_by: int | None) -> dict:
        """A one-time invitation; its token is returned here only."""
        if role not in ROLES:
            raise InvalidArgument(f"role must be one of {', '.join(ROLES)}")
        token, public_id, now = self._token(), self._new_id("inv_"), self._now_ms()
        with self.db.transaction() as conn:
            conn.execute(
                _INSERT_INVITATION,
                (public_id, account_id, role, hash_secret(token), invited_by, now,
                 now + INVITATION_MS))
        return {"id": public_id, "token": token, "role": role}

    def pending(self, account_id: int) -> list[dict]:
        rows = self.db.conn().execute(
            _PENDING_INVITATIONS, (account_id, self._now_ms()))
        return [{"id": r[0], "role": r[1], "created_at": _iso(r[2])[:10],
                 "expires_at": _iso(r[3])[:16].replace("T", " ")} for r in rows]

    def revoke_invitation(self, account_id: int, public_id: str) -> bool:
        with self.db.transaction() as conn:
            return conn.execute(
                _REVOKE_INVITATION,
                (self._now_ms(), account_id, public_id)).rowcount == 1

    _OPEN_INVITATION = (
        "SELECT i.id, i.public_id, i.account_id, a.name, i.role FROM invitations i"
        " JOIN accounts a ON a.id = i.account_id WHERE i.token_hash = ? AND i.used_at IS NULL"
        " AND i.revoked_at IS NULL AND i.expires_at > ?")

    def find_invitation(self, token: str) -> Invitation | None:
        row = self.db.conn().execute(self._OPEN_INVITATION,
                                     (hash_secret(token), self._now_ms())).fetchone()
        return None if row is None else Invitation(row[1], row[2], row[3], row[4])

    def accept(self, token: str, *, user_id: int | None = None, email: str = "",
               password_hash: str = "") -> tuple[Invitation, int] | None:
        """Spend the invitation: the signed-in user (user_id) joins its account, or a new
        user (email, password_hash) is made who does; (the invitation, the user's id). None:
        the link is not valid any more.
        A member already in the account keeps the role they had."""
        now = self._now_ms()
        if user_id is None:
            email = normalize_email(email)
        with self.db.transaction() as conn:
            row = conn.execute(self._OPEN_INVITATION, (hash_secret(token), now)).fetchone()
            if row is None:
                return None
            if user_id is None:
                if conn.execute(_USER_WITH_EMAIL, (email,)).fetchone():
                    raise InvalidArgument(
                        "a user with this email exists: sign in, then open the link again")
                user_id = conn.execute(
                    _INSERT_USER,
                    (self._new_id("user_"), email, password_hash, now)).fetchone()[0]
            conn.execute(_ADD_MEMBERSHIP,
                         (user_id, row[2], row[4]))
            conn.execute(_MARK_INVITATION_USED, (now, row[0]))
        return Invitation(row[1], row[2], row[3], row[4]), user_id
