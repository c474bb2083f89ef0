"""The one module that reads Tally's environment.

Every other module receives a Config (or values taken from it) as an argument.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass


class ConfigError(ValueError):
    """An environment variable holds a value Tally cannot use."""


@dataclass(frozen=True)
class Config:
    db_path: str = "var/tally.db"
    # postgresql://user@host/db selects PostgreSQL (storage/postgres.py); unset, the SQLite
    # file db_path is the database.
    database_url: str | None = None
    database_pool: int = 8  # PostgreSQL connections each process lends its request threads
    # Whether the payment writer's and the flush thread's PostgreSQL connections prepare
    # their statements (off for PgBouncer's transaction mode before 1.21, which cannot keep
    # them per client).
    database_prepared: bool = True
    # A streaming replica of database_url that reads over HTTP use while it is at most
    # replica_max_lag seconds behind (storage/replica.py).
    database_read_url: str | None = None
    replica_max_lag: float = 10.0
    queue_max: int = 10_000
    flush_interval: float = 1.0
    log_level: str = "INFO"
    # Tuning, set in code (no environment variable): defaults the tests and benches rely on.
    cache_ttl: float = 1.0  # seconds a key, site or shared usage count is reused (revocation bound)
    cache_entries: int = 10_000  # per in-process cache; a full cache starts over
    busy_timeout_ms: int = 5_000  # a request-path write waits this long for the lock, then 503
    flush_busy_timeout_ms: int = 1_000  # the flush thread's wait, before it backs off and retries
    flush_backoff: tuple[float, float] = (0.05, 1.0)  # first and longest pause between retries
    # Peers whose X-Forwarded-For POST /api/v1/collect believes (api/client_ip.py).
    trusted_proxies: tuple = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1"))
    # Where people reach Tally (scheme and host, e.g. https://tally.example.com); an https
    # URL makes the dashboard's cookies Secure, and the install snippet uses it.
    public_url: str = ""
    log_format: str = "text"
    metrics_token: str | None = None
    retention_days: int | None = None
    # POST /api/v1/collect per client address block (IPv4 address, IPv6 /64) and worker:
    # requests a second, and at once (quota/anonymous.py). A rate of 0 turns it off.
    collect_rate: float = 10.0
    collect_burst: int = 200
    # Percent of the plan's allowance, below the cap, that anonymous events cannot spend.
    keyed_reserve_percent: int = 10
    # Tuning, set in code: distinct user ids one visitor's browser may identify as a day.
    identifies_per_visitor: int = 5
    # Seconds of database time one HTTP read (a Stats API report, a dashboard page) may
    # take before it is stopped and answered 422 query_too_expensive (None: no bound).
    # The service's default is READ_BUDGET (from_env); a Config built in code (a test, a
    # tool) has no bound unless it asks for one, so no figure depends on a machine's load.
    read_budget: float | None = None
    # SQLite virtual-machine steps between two checks of a read's budget (tuning, set in
    # code; storage.db.READ_BUDGET_CHECK_STEPS).
    read_budget_check_steps: int = 100_000
    # Each worker's threads for the reads of users and keys, and as many for shared links'
    # anonymous viewers, and how much lower their CPU priority is than the request
    # threads' (storage/reads.py; tuning, set in code).
    read_threads: int = 1
    read_nice: int = 10
    # Reads at once on the machine over the database, whichever worker runs them, under the
    # server (storage/read_processes.py; tuning, set in code). None: one fewer than the
    # cores, at least one.
    read_slots: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        env = os.environ if environ is None else environ
        defaults = cls()
        return cls(
            db_path=env.get("TALLY_DB") or defaults.db_path,
            database_url=_database_url(env),
            database_read_url=_database_read_url(env),
            replica_max_lag=_positive_float(env, "TALLY_REPLICA_MAX_LAG",
                                            defaults.replica_max_lag),
            database_pool=_int_between(env, "TALLY_DATABASE_POOL", defaults.database_pool,
                                       (1, 1000), "one connection"),
            database_prepared=_choice(env, "TALLY_DATABASE_PREPARED", ("on", "off"),
                                      "on") == "on",
            queue_max=_int_between(env, "TALLY_QUEUE_MAX", defaults.queue_max,
                                   QUEUE_MAX_RANGE, "the largest batch one request may carry"),
            flush_interval=_positive_float(env, "TALLY_FLUSH_INTERVAL", defaults.flush_interval),
            log_level=_log_level(env, defaults.log_level),
            trusted_proxies=_networks(env, "TALLY_TRUSTED_PROXIES", defaults.trusted_proxies),
            public_url=_public_url(env),
            log_format=_choice(env, "TALLY_LOG_FORMAT", ("text", "json"), defaults.log_format),
            metrics_token=_metrics_token(env),
            retention_days=_positive_int(env, "TALLY_RETENTION_DAYS", None),
            collect_rate=_rate(env, "TALLY_COLLECT_RATE", defaults.collect_rate),
            collect_burst=_int_between(env, "TALLY_COLLECT_BURST", defaults.collect_burst,
                                       (1, 1_000_000), "one request"),
            keyed_reserve_percent=_int_between(env, "TALLY_KEYED_RESERVE",
                                               defaults.keyed_reserve_percent, (0, 100),
                                               "no reserve"),
            read_budget=_positive_float(env, "TALLY_READ_BUDGET", READ_BUDGET),
        )


def _networks(env: Mapping[str, str], name: str, default: tuple) -> tuple:
    """Addresses or CIDRs separated by commas or spaces; `none` for no proxy at all."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    if raw.strip().lower() == "none":
        return ()
    networks = []
    for item in raw.replace(",", " ").split():
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {item!r} is not an IP address or CIDR") from None
    return tuple(networks)


# Seconds one read over HTTP may take in the service (TALLY_READ_BUDGET's default): on an
# idle machine a read's thread uses about as much CPU as time, and the worst read the
# limits allow must cost at most 2 s of CPU with its request (bench/reads.py).
READ_BUDGET = 1.8

# A queue smaller than one request's batch refuses every such request forever (503); the
# top bounds the memory a worker may hold (events of at most 8 KB bodies / 50 events).
# The low end is the spec's 50 events per batch (validation.event.MAX_BATCH, a layer up;
# tests/test_hardening.py holds them equal).
QUEUE_MAX_RANGE = (50, 1_000_000)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _whole_number(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None


def _positive_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = _whole_number(env, name)
    if value is None:
        return default
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, not {value}")
    return value


def _int_between(env: Mapping[str, str], name: str, default: int, bounds: tuple[int, int],
                 why_low: str) -> int:
    value = _whole_number(env, name)
    if value is None:
        return default
    low, high = bounds
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} ({why_low}) and {high}, not {value}")
    return value


def _log_level(env: Mapping[str, str], default: str) -> str:
    level = (env.get("TALLY_LOG_LEVEL") or default).upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"TALLY_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)},"
                          f" not {env.get('TALLY_LOG_LEVEL')!r}")
    return level


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not 0 < value <= 3600:
        raise ConfigError(f"{name} must be between 0 and 3600 seconds, not {raw}")
    return value


def _rate(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of requests a second, not {raw!r}") from None
    if not 0 <= value <= 1_000_000:
        raise ConfigError(f"{name} must be between 0 (no limit) and 1000000, not {raw}")
    return value


def _public_url(env: Mapping[str, str]) -> str:
    raw = (env.get("TALLY_PUBLIC_URL") or "").strip()
    if not raw:
        return ""
    scheme, sep, rest = raw.partition("://")
    if scheme not in ("http", "https") or not sep or not rest.strip("/") or any(
            c in rest for c in " ?#"):
        raise ConfigError(f"TALLY_PUBLIC_URL must look like https://tally.example.com, not {raw!r}")
    return raw.rstrip("/")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = (env.get(name) or default).lower()
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {env.get(name)!r}")
    return raw


def _database_url(env: Mapping[str, str]) -> str | None:
    raw = env.get("TALLY_DATABASE_URL", "").strip()
    if not raw:
        return None
    if not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError("TALLY_DATABASE_URL must be a postgresql:// URL"
                          " (leave it unset for the SQLite file TALLY_DB)")
    return raw


def _database_read_url(env: Mapping[str, str]) -> str | None:
    raw = env.get("TALLY_DATABASE_READ_URL", "").strip()
    if not raw:
        return None
    if not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError("TALLY_DATABASE_READ_URL must be a postgresql:// URL")
    if not env.get("TALLY_DATABASE_URL", "").strip():
        raise ConfigError("TALLY_DATABASE_READ_URL needs TALLY_DATABASE_URL: the replica"
                          " is a copy of that PostgreSQL database")
    return raw


def _metrics_token(env: Mapping[str, str]) -> str | None:
    token = env.get("TALLY_METRICS_TOKEN") or None
    if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
        raise ConfigError("TALLY_METRICS_TOKEN must be at least 16 printable characters "
                          "without spaces")
    return token
