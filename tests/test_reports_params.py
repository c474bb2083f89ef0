"""Report parameters: dates, ranges, limits and dimensions, with the 400 messages they carry."""

from __future__ import annotations

from datetime import date

import pytest

from reports.shared.params import (
    DAY_MS,
    DateRange,
    InvalidReportParameter,
    check_known,
    end_of_day_ms,
    parse_at,
    parse_date_range,
    parse_dimension,
    parse_limit,
    utc_today,
)
from tests.conftest import FakeClock

TODAY = date(2026, 9, 21)


@pytest.mark.parametrize(
    ("params", "start", "end"),
    [
        ({}, date(2026, 8, 23), date(2026, 9, 21)),  # the 30 days ending today
        ({"from": "2026-09-01"}, date(2026, 9, 1), date(2026, 9, 21)),
        ({"to": "2026-03-31"}, date(2026, 3, 2), date(2026, 3, 31)),
        ({"from": "2026-09-21", "to": "2026-09-21"}, date(2026, 9, 21), date(2026, 9, 21)),
        ({"from": "2024-02-29", "to": "2025-02-28"}, date(2024, 2, 29), date(2025, 2, 28)),
        ({"from": "2026-01-01", "to": "2027-01-01"}, date(2026, 1, 1), date(2027, 1, 1)),
    ],
)
def test_date_range_defaults_and_values(params, start, end):
    assert parse_date_range(params, TODAY) == DateRange(start, end)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "2026-9-1"}, "from: must be a UTC date YYYY-MM-DD, not '2026-9-1'"),
        ({"from": "20260901"}, "from: must be a UTC date YYYY-MM-DD, not '20260901'"),
        ({"to": "2026-09-01T00:00:00Z"},
         "to: must be a UTC date YYYY-MM-DD, not '2026-09-01T00:00:00Z'"),
        ({"to": "2026-02-30"}, "to: '2026-02-30' is not a calendar date"),
        ({"from": "2026-09-10", "to": "2026-09-09"}, "from: 2026-09-10 is after to 2026-09-09"),
        ({"from": "2026-09-22"}, "from: 2026-09-22 is after to 2026-09-21"),
        ({"from": "2025-01-01", "to": "2026-01-02"},
         "from/to: the range covers more than 366 days"),
        ({"from": ["2026-09-01", "2026-09-02"]}, "from: give it at most once"),
        ({"to": ""}, "to: must be a UTC date YYYY-MM-DD, not ''"),
    ],
)
def test_bad_date_ranges_are_refused_with_a_message(params, message):
    with pytest.raises(InvalidReportParameter) as err:
        parse_date_range(params, TODAY)
    assert str(err.value) == message


def test_range_bounds_are_whole_utc_days():
    period = DateRange(date(2026, 9, 1), date(2026, 9, 30))
    assert period.start_ms == 1_788_220_800_000  # 2026-09-01T00:00:00Z
    assert period.end_ms == 1_788_220_800_000 + 30 * DAY_MS  # 2026-10-01T00:00:00Z, exclusive
    assert period.days == 30
    assert end_of_day_ms(date(1970, 1, 1)) == DAY_MS


def test_at_defaults_to_today_of_the_clock():
    assert utc_today(FakeClock(1_790_000_000.0)) == date(2026, 9, 21)
    assert utc_today(FakeClock(1_790_035_199.999)) == date(2026, 9, 21)  # 23:59:59.999
    assert utc_today(FakeClock(1_790_035_200.0)) == date(2026, 9, 22)
    assert parse_at({}, TODAY) == TODAY
    assert parse_at({"at": "2025-12-31"}, TODAY) == date(2025, 12, 31)
    with pytest.raises(InvalidReportParameter, match="^at: must be a UTC date YYYY-MM-DD"):
        parse_at({"at": "yesterday"}, TODAY)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 100), ("", None), ("1", 1), ("1000", 1000), ("0", None), ("1001", None),
     ("-5", None), ("10.5", None), ("ten", None), ("99999999999", None)],
)
def test_limit(raw, expected):
    params = {} if raw is None else {"limit": raw}
    if expected is None:
        with pytest.raises(InvalidReportParameter) as err:
            parse_limit(params)
        assert str(err.value) == "limit: must be a whole number from 1 to 1000"
    else:
        assert parse_limit(params) == expected


@pytest.mark.parametrize(
    "by", ["channel", "source", "page", "entry_page", "country", "device", "browser", "os", "event",
           "medium", "campaign", "term", "content"])
def test_every_breakdown_dimension_is_accepted(by):
    assert parse_dimension({"by": by}) == by


@pytest.mark.parametrize("params", [{}, {"by": ""}, {"by": "Country"}, {"by": "visitor_id"},
                                    {"by": "country; DROP TABLE events"}])
def test_other_dimensions_are_refused(params):
    with pytest.raises(InvalidReportParameter) as err:
        parse_dimension(params)
    assert str(err.value) == ("by: must be one of channel, source, page, entry_page, country, "
                              "device, browser, os, event, medium, campaign, term, content")


def test_unknown_parameters_are_refused():
    check_known({"from": "x", "to": "y"}, ("from", "to"))
    with pytest.raises(InvalidReportParameter) as err:
        check_known({"form": "2026-01-01"}, ("from", "to"))
    assert str(err.value) == "unknown parameter 'form'; this report takes from, to"
