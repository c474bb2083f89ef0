"""The one connection type the layers above storage name: what a sqlite3 connection and a
PostgreSQL one (storage.postgres.PostgresConnection) both are. Code above storage holds a
connection only to hand it to storage's functions and the reports' query modules, so it
needs nothing more than this; tests/test_layers.py checks both engines' connections are one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Cursor(Protocol):
    """The rows of one statement."""

    @property
    def rowcount(self) -> int: ...

    @property
    def description(self) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int, /) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


@runtime_checkable
class Connection(Protocol):
    """A connection in autocommit mode, transactions explicit (Database.transaction)."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor: ...

    def close(self) -> None: ...
