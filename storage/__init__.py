"""SQLite storage: one file in WAL mode shared by every worker and the CLI."""

from storage.db import Database, StorageBusy, StorageError

__all__ = ["Database", "StorageError", "StorageBusy"]
