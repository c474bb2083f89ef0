"""The per-worker path from an accepted request to the database: a bounded in-memory
queue and the thread that drains it."""
