"""Bearer API keys: parse the header, look the hash up, check revocation and scope."""

from __future__ import annotations

from collections.abc import Callable

import falcon

from api.caches import TTLCache
from api.errors import forbidden, unauthorized
from storage.directory import KEY_PATTERN, Directory, KeyRecord, hash_secret


def key_scope(scope: str | None):
    """A Falcon `before` hook: the Authorization header must carry a live key with `scope`
    (None: any scope), checked by the resource's `auth`; the key is then req.context.key.
    Errors come out as 401/403 before the responder runs (and before any body is read)."""

    def authenticate(req: falcon.Request, resp, resource, params) -> None:
        req.context.key = resource.auth.authenticate(req.get_header("Authorization"), scope)

    return authenticate


class Authenticator:
    def __init__(self, directory: Directory, clock: Callable[[], float], ttl: float = 1.0,
                 max_entries: int = 10_000):
        # Keyed by the SHA-256 of the secret, so the secret itself is never kept.
        self._keys = TTLCache(directory.find_key, clock, ttl, max_entries)

    def authenticate(self, authorization: str | None, scope: str | None) -> KeyRecord:
        if not authorization:
            raise unauthorized("missing API key: send Authorization: Bearer <key>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not KEY_PATTERN.fullmatch(token):
            raise unauthorized("malformed Authorization header: expected Bearer <key>")
        key = self._keys.get(hash_secret(token))
        if key is None or key.revoked:
            raise unauthorized("unknown or revoked API key")
        if scope is not None and scope not in key.scopes:
            raise forbidden(f"this API key lacks the {scope} scope")
        return key
