"""When a PostgreSQL writer has its statements planned again as its tables grow.

A connection's prepared statements and its foreign keys' checks are planned once, by their
first runs; made while the tables were nearly empty, a plan may read rows through an index
on site_id alone, and only new statistics or a re-plan change it. The writers (the payment
writer, the flush thread) count what they stored on their connection and re-plan each time
it has doubled."""

from __future__ import annotations


class ReplanSchedule:
    """Rows stored on one connection, and whether they have doubled since the last re-plan
    (the first at `first` rows)."""

    def __init__(self, first: int):
        self.restart(first)

    def restart(self, first: int) -> None:
        """A new connection: its count starts again."""
        self.stored, self.next_at = 0, first

    def add(self, rows: int) -> None:
        self.stored += rows

    def due(self) -> bool:
        """Whether to re-plan now; once it says so, the next is at twice the count."""
        if self.stored < self.next_at:
            return False
        self.next_at = 2 * self.stored
        return True
