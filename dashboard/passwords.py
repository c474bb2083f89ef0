"""Password hashing with argon2id (argon2-cffi).

Parameters: memory 19 MiB, 2 passes, 1 lane: the OWASP Password Storage Cheat Sheet's
first argon2id configuration. On a 2-core server one check takes about 25-40 ms and 19 MiB,
so a burst of sign-ins cannot exhaust memory, while a guess costs an attacker with the
stolen hash the same 19 MiB each. The encoded hash records its parameters: when they
are raised here, a user's hash is upgraded at their next successful sign-in.
"""

from __future__ import annotations

import functools

MIN_LENGTH = 10
MAX_LENGTH = 1024  # bounds the work one sign-in can ask for



@functools.cache
def hasher():
    """The argon2id hasher, imported on the first sign-in (argon2-cffi loads a C library
    a worker that only ingests does not need)."""
    from argon2 import PasswordHasher

    return PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1,
                          hash_len=32, salt_len=16)


class WeakPassword(ValueError):
    """The password is too short or too long; str() says which."""


def check_strength(password: str) -> None:
    if len(password) < MIN_LENGTH:
        raise WeakPassword(f"the password must be at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise WeakPassword(f"the password must be at most {MAX_LENGTH} characters")


def hash_password(password: str) -> str:
    check_strength(password)
    return hasher().hash(password)


def verify(password_hash: str, password: str) -> bool:
    if len(password) > MAX_LENGTH:
        return False
    from argon2.exceptions import InvalidHashError, VerificationError

    try:
        return hasher().verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    return hasher().check_needs_rehash(password_hash)


@functools.cache
def _decoy_hash() -> str:
    return hasher().hash("decoy password for unknown emails")


def spend_like_verify(password: str) -> None:
    """An unknown email costs as much time as a wrong password, so timing tells neither."""
    verify(_decoy_hash(), password)
