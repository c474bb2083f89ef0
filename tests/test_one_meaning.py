"""One meaning per rule (issue 27): a filter keeps the same rows in traffic as in revenue by
first touch, on both engines. `~` ignores case as Python's str.lower() does, for every
Unicode letter; a `prop:` comparison takes numbers by value. The Python reference is
reports.segments.filters.touch_matches (what revenue by first touch decides with); traffic
is reports.segments.queries on each engine, and tests/segments_reference.py's statements
(each rule decided over every stored value) give the same figures."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.segments.filters import Filter, contains, prop_equal, touch_matches
from reports.segments.queries import Segment, SegmentTotals, resolve
from storage.events import EventRow
from tests.segments_reference import Segment as ReferenceSegment
from tests.segments_reference import by_the_rules

DAY_MS = 86_400_000
FIRST_DAY = 20_717
SITE_ID = 1
START, END = FIRST_DAY * DAY_MS, (FIRST_DAY + 1) * DAY_MS

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


def _event(n: int, pathname: str, props: str | None) -> tuple:
    return (EventRow(
        SITE_ID, START + n * 1000, "pageview", n + 1, pathname, f"https://example.com{pathname}",
        "example.com", None, None, None, None, None, None, props, None, None, None, None,
        None, None, None, None, None, None, None, None, None, None, None), None)


def _pageviews(store, events: list[tuple], filters: tuple[Filter, ...]) -> int:
    from storage.events import insert_events

    conn = store.conn()
    with store.transaction() as tx:
        tx.execute("DELETE FROM events")
        insert_events(tx, [e for e, _ in events], [s for _, s in events])
    segment = Segment(resolve(conn, SITE_ID, filters, START, END + DAY_MS), None)
    counted = segment.bucket_totals(conn, SITE_ID, START, END, DAY_MS).get(0, SegmentTotals())
    reference = ReferenceSegment(by_the_rules(conn, SITE_ID, filters), None)
    assert counted == reference.totals(conn, SITE_ID, START, END)
    return counted.pageviews


def _case_changed(text: str, how: int) -> str:
    return (text, text.upper(), text.lower(), text.swapcase(), text.title())[how]


def test_contains_ignores_the_case_of_every_letter():
    assert contains("/Über", "über") and contains("/ÉTÉ", "été") and not contains("/a", "b")


@pytest.mark.parametrize(("value", "wanted", "equal"), [
    (1e20, "100000000000000000000", True), ("1e20", "100000000000000000000", True),
    ("100000000000000000000", "1E+20", True), (100, "1e2", True), (1.0e20, "1.0e+20", True),
    (True, "1", True), ("Pro", "Pro", True), ("Pro", "pro", False), (42, "42.5", False),
    ("0x10", "16", False), ("1_000", "1000", False), ("nan", "nan", True),
])
def test_numbers_compare_by_value(value, wanted, equal):
    assert prop_equal(value, wanted) is equal


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=st.lists(_TEXT, min_size=1, max_size=5), data=st.data())
def test_contains_keeps_the_same_pages_in_traffic_as_by_first_touch(store, pages, data):
    page = data.draw(st.sampled_from(pages))
    start = data.draw(st.integers(0, len(page) - 1))
    wanted = _case_changed(page[start:start + data.draw(st.integers(1, 3))],
                           data.draw(st.integers(0, 4)))
    if data.draw(st.booleans()):
        wanted = data.draw(_TEXT)
    filters = (Filter("page", "~", (wanted,)),)
    pathnames = ["/" + p for p in pages]
    expected = sum(touch_matches(filters, {"page": p}) for p in pathnames)
    events = [_event(n, p, None) for n, p in enumerate(pathnames)]
    assert _pageviews(store, events, filters) == expected


def _spellings(mantissa: int, exponent: int) -> list[str]:
    """One number in the forms a JSON document may hold it: 1e20, 1E+20, 100000000000000000000."""
    plain = str(mantissa) + "0" * exponent
    return [f"{mantissa}e{exponent}", f"{mantissa}E+{exponent}", plain,
            f"{mantissa}.0e{exponent}"]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(numbers=st.lists(st.tuples(st.integers(-999, 999), st.integers(0, 30)), min_size=1,
                        max_size=4),
       data=st.data())
def test_prop_filters_compare_numbers_by_value(store, numbers, data):
    stored = [data.draw(st.sampled_from(_spellings(m, k))) for m, k in numbers]
    if data.draw(st.booleans()):
        stored.append(orjson.dumps(data.draw(_TEXT)).decode())  # a text among the numbers
    mantissa, exponent = data.draw(st.sampled_from(numbers))
    wanted = data.draw(st.sampled_from(_spellings(mantissa, exponent)))
    operator = data.draw(st.sampled_from(("==", "!=")))
    filters = (Filter("prop", operator, (wanted,), "n"),)
    documents = ['{"n": %s}' % text for text in stored]  # noqa: UP031 - JSON as written
    expected = sum(touch_matches(filters, {"props": orjson.loads(d)}) for d in documents)
    events = [_event(n, "/", d) for n, d in enumerate(documents)]
    assert _pageviews(store, events, filters) == expected


def test_page_contains_uber_keeps_uber_in_traffic(store):
    filters = (Filter("page", "~", ("über",)),)
    events = [_event(0, "/Über", None), _event(1, "/uber", None), _event(2, "/ÜBERALL", None)]
    assert _pageviews(store, events, filters) == 2
    assert touch_matches(filters, {"page": "/Über"})


def test_prop_1e20_is_100000000000000000000_in_traffic(store):
    events = [_event(0, "/", '{"n": 100000000000000000000}'), _event(1, "/", '{"n": 1e20}'),
              _event(2, "/", '{"n": "1e20"}'), _event(3, "/", '{"n": 1e21}')]
    assert _pageviews(store, events, (Filter("prop", "==", ("1e20",), "n"),)) == 3
    assert _pageviews(store, events, (Filter("prop", "!=", ("1E+20",), "n"),)) == 1
