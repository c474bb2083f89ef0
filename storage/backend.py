"""Which database a Config names: PostgreSQL when it has a database_url, else SQLite."""

from __future__ import annotations

from storage.db import Database


def open_database(config, *, parallel_query: bool = True):
    """A Database (SQLite) or a PostgresDatabase; neither connects until first used.
    `parallel_query`: PostgreSQL's (PostgresDatabase)."""
    if config.database_url:
        from storage.postgres import PostgresDatabase  # psycopg loads only when chosen

        return PostgresDatabase(config.database_url, busy_timeout_ms=config.busy_timeout_ms,
                                pool_size=config.database_pool,
                                read_url=config.database_read_url,
                                replica_max_lag=config.replica_max_lag,
                                parallel_query=parallel_query,
                                prepared_statements=config.database_prepared)
    return Database(config.db_path, busy_timeout_ms=config.busy_timeout_ms)
