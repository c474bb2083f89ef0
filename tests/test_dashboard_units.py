"""The dashboard's pure parts: the period picker, the filter text, number formatting, and
the vendored uPlot files checked against their recorded hashes."""

from __future__ import annotations

import hashlib
from datetime import date
from decimal import Decimal
from importlib import resources

import pytest

from dashboard import filters, render
from dashboard.periods import resolve
from reports.shared.params import InvalidReportParameter

TODAY = date(2026, 3, 15)

# The files of uPlot 1.6.32 as published on npm (dashboard/static/vendor/uplot/ORIGIN.md).
UPLOT = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    "LICENSE": "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd",
}


@pytest.mark.parametrize("name, digest", UPLOT.items())
def test_vendored_uplot_is_the_published_file(name, digest):
    data = resources.files("dashboard").joinpath("static", "vendor", "uplot", name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest


def test_uplot_origin_and_licence_are_recorded():
    folder = resources.files("dashboard").joinpath("static", "vendor", "uplot")
    origin = folder.joinpath("ORIGIN.md").read_text()
    assert "uplot@1.6.32" in origin and "MIT" in origin
    assert all(digest in origin for digest in UPLOT.values())
    assert folder.joinpath("LICENSE").read_text().startswith("The MIT License")


@pytest.mark.parametrize("query, start, end, interval", [
    ({}, date(2026, 2, 14), TODAY, "day"),
    ({"period": "today"}, TODAY, TODAY, "hour"),
    ({"period": "7d"}, date(2026, 3, 9), TODAY, "day"),
    ({"period": "month"}, date(2026, 3, 1), TODAY, "day"),
    ({"period": "lastmonth"}, date(2026, 2, 1), date(2026, 2, 28), "day"),
    ({"period": "12mo"}, date(2025, 3, 16), TODAY, "month"),
    ({"period": "custom", "from": "2026-01-01", "to": "2026-01-31"},
     date(2026, 1, 1), date(2026, 1, 31), "day"),
    ({"from": "2026-03-10", "to": "2026-03-10"}, date(2026, 3, 10), date(2026, 3, 10), "hour"),
])
def test_periods(query, start, end, interval):
    period = resolve(query, TODAY)
    assert (period.start, period.end, period.interval) == (start, end, interval)
    before = period.previous()
    assert before.days == period.days and (period.start - before.end).days == 1


@pytest.mark.parametrize("query, message", [
    ({"period": "week"}, "period: must be one of"),
    ({"period": "custom"}, "needs a from or to date"),
    ({"period": "custom", "from": "2026-03-20", "to": "2026-03-01"}, "is after"),
    ({"period": "custom", "from": "2020-01-01", "to": "2026-01-01"}, "more than 366 days"),
])
def test_bad_periods(query, message):
    with pytest.raises(InvalidReportParameter, match=message):
        resolve(query, TODAY)


def test_filter_text_round_trip():
    text = filters.with_filter("", "channel", "Organic Search")
    assert text == "channel==Organic Search"
    text = filters.with_filter(text, "page", "/a;b|c")
    assert text == "channel==Organic Search;page==/a\\;b\\|c"
    assert [(d, o, v) for d, o, v, _ in filters.split(text)] == [
        ("channel", "==", "Organic Search"), ("page", "==", "/a;b|c")]
    # A second value for a dimension replaces the first.
    assert filters.with_filter(text, "channel", "Direct") == "page==/a\\;b\\|c;channel==Direct"
    assert filters.without(text, "channel==Organic Search") == "page==/a\\;b\\|c"
    assert [(d, o, v) for d, o, v, _ in filters.split("visit:source!=Google|Bing")] == [
        ("source", "!=", "Google or Bing")]


@pytest.mark.parametrize("value, currency, text", [
    (Decimal("1234.5"), "EUR", "€1,234.50"), (Decimal("-3.10"), "USD", "-$3.10"),
    (Decimal("1200"), "JPY", "¥1,200"), (Decimal("7.125"), "KWD", "7.125 KWD"),
    (None, "EUR", "–"), (Decimal(0), None, "0"),
])
def test_money(value, currency, text):
    assert render.money(value, currency) == text


def test_figures_formatting():
    assert render.number(12345) == "12,345" and render.percent(0.4567) == "45.7%"
    assert render.percent(0.5) == "50%" and render.duration(75.4) == "1m 15s"
    assert render.duration(3725) == "1h 02m" and render.duration(9) == "9s"
    assert render.change(0.123) == "+12%" and render.change(-0.05) == "-5.0%"
    assert render.change(None) == "" and render.change(0) == "±0%"
