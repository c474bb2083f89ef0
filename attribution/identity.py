"""Verified identity: a user id from the browser links a customer only when the site's
own server vouches for it, with an HMAC-SHA256 of the user id under the site's identity
secret (`tally site identity-secret`), as Intercom's identity verification does.

Pure: the secret comes from storage.identity_secrets, the hash from the request.
"""

from __future__ import annotations

import hashlib
import hmac

HASH_MAX_CHARS = 128


def identity_hash(secret: str, user_id: str) -> str:
    """What the site's server computes: lower-case hex HMAC-SHA256 of the user id's UTF-8
    bytes, keyed with the secret's UTF-8 bytes (the whole string, prefix included)."""
    return hmac.new(secret.encode("utf-8"), user_id.encode("utf-8"), hashlib.sha256).hexdigest()


def vouched(secret: str | None, user_id: str, given: str | None) -> bool:
    """Whether `given` is the identity hash of `user_id` under `secret` (compared in
    constant time; hex digits in either case)."""
    if secret is None or not given or len(given) != 64:
        return False
    return hmac.compare_digest(identity_hash(secret, user_id), given.lower())
