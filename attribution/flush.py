"""The assign-sessions step of the events flush (ingest/pipeline.py).

`assign_sessions(conn, rows, previous_visitor_ids)` runs inside the flush transaction,
before the events are inserted: it records sessions and `$identify` links and returns
each row's session id, so events, sessions, links and first touches commit (or roll
back) together. On SQLite the flush runs `decide_sessions` before the transaction and
writes its plan inside it (ingest.pipeline.BatchWriter).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import partial
from operator import itemgetter

from attribution.sessions import Hit, SessionPlan, SessionWriter
from storage.connection import Connection
from storage.events import EventRow
from vocabulary import CLICK_IDS, UTM_KEYS

_at = {name: index for index, name in enumerate(EventRow._fields)}
_head = itemgetter(*(_at[name] for name in (
    "site_id", "visitor_id", "ts", "name", "url", "pathname", "referrer", "referrer_host")))
_utm = itemgetter(*(_at[key] for key in UTM_KEYS))
_click_columns = [(key, _at[key]) for key in CLICK_IDS]
_UID = _at["uid"]
# The UTM and click-id columns follow one another in EventRow: most rows set none of them,
# and one comparison of that slice tells so.
_CAMPAIGN = slice(_at[UTM_KEYS[0]], _at[CLICK_IDS[-1]] + 1)
assert EventRow._fields[_CAMPAIGN] == (*UTM_KEYS, *CLICK_IDS)
_NO_CAMPAIGN = (None,) * (len(UTM_KEYS) + len(CLICK_IDS))
_NO_UTM = (None,) * len(UTM_KEYS)
# Hit(*fields) runs NamedTuple's generated __new__ in Python; a flush makes a Hit per
# event, so it builds each from its full tuple of fields in one C call.
_hit = partial(tuple.__new__, Hit)

_writer = SessionWriter()


def assign_sessions(conn: Connection, rows: Sequence[EventRow],
                    previous_visitor_ids: Sequence[int | None],
                    unlinked: Collection[int] = ()) -> list[int | None]:
    """The session id of each row (None for `$identify` and rows without a visitor).

    unlinked: indexes of `$identify` rows whose uid links nothing (an anonymous identify
    no identity hash verified): the row is stored, the link is not."""
    return decide_sessions(conn, rows, previous_visitor_ids, unlinked).write(conn)


def decide_sessions(conn: Connection, rows: Sequence[EventRow],
                    previous_visitor_ids: Sequence[int | None],
                    unlinked: Collection[int] = ()) -> SessionPlan:
    """assign_sessions' decisions, with reads only; SessionPlan.write writes them."""
    if not rows:
        return SessionPlan([], None, [], [])
    hits = []
    append = hits.append
    for row, previous_visitor in zip(rows, previous_visitor_ids, strict=True):
        # One concatenation of two tuples: `(*head, ...)` builds a list first.
        if row[_CAMPAIGN] == _NO_CAMPAIGN:
            append(_hit(_head(row) + (_NO_UTM, (), row[_UID], previous_visitor)))
        else:
            click_ids = tuple(key for key, index in _click_columns if row[index])
            append(_hit(_head(row) + (_utm(row), click_ids, row[_UID], previous_visitor)))
    for index in unlinked:
        hits[index] = hits[index]._replace(uid=None)
    return _writer.decide(conn, hits)
