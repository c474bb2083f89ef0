"""Filters, goals, comparison ranges, buckets and changes: the pure parts, by hand."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from reports.money.revenue import RevenuePayment
from reports.segments.filters import (
    Filter,
    Goal,
    comparison_range,
    parse_filters,
    parse_goal,
    segment_key,
    touch_matches,
)
from reports.shared.params import DateRange, InvalidReportParameter, day_start_ms
from reports.timeseries import buckets, change, revenue_per_bucket


def test_filters_parse_with_escapes_lists_and_prefixes():
    filters = parse_filters({"filters": r"visit:source==b|a\|x;event:page~/a\;b;prop:plan!=pro"})
    assert filters == (
        Filter("page", "~", ("/a;b",)),
        Filter("prop", "!=", ("pro",), "plan"),
        Filter("source", "==", ("a|x", "b")),
    )
    # Order and repetition of filters or values make no new segment.
    again = parse_filters({"filters": r"prop:plan!=pro;source==a\|x|b|b;page~/a\;b"})
    assert segment_key(again, Goal("page", "/x")) == segment_key(filters, Goal("page", "/x"))
    assert segment_key(filters, None) == r"page~/a\;b;prop:plan!=pro;source==a\|x|b"
    assert parse_filters({"filters": "event:name==signup"}) == (Filter("event", "==", ("signup",)),)


def test_limits_on_filters():
    with pytest.raises(InvalidReportParameter, match="at most 10 filters"):
        parse_filters({"filters": ";".join(f"source=={i}" for i in range(11))})
    with pytest.raises(InvalidReportParameter, match="more than 50 values"):
        parse_filters({"filters": "source==" + "|".join(map(str, range(51)))})
    with pytest.raises(InvalidReportParameter, match="longer than 1000"):
        parse_filters({"filters": "source==" + "a" * 1000})
    with pytest.raises(InvalidReportParameter, match="control character"):
        parse_filters({"filters": "source==a\x00"})


def test_goals():
    assert parse_goal({"goal": "signup"}) == Goal("event", "signup")
    assert parse_goal({"goal": "page:/pricing"}) == Goal("page", "/pricing")
    assert parse_goal({}) is None


def test_touch_matches_reads_the_first_touch():
    touch = {"source": "Google", "page": "/pricing", "props": {"plan": "pro", "seats": 3}}
    assert touch_matches(parse_filters({"filters": "source==Google;page~PRIC"}), touch)
    assert not touch_matches(parse_filters({"filters": "source!=Google"}), touch)
    assert touch_matches(parse_filters({"filters": "prop:seats==3;prop:plan!=free"}), touch)
    assert not touch_matches(parse_filters({"filters": "prop:plan!=pro"}), touch)
    # Without a first touch, nothing equals or contains, everything "does not equal".
    assert touch_matches(parse_filters({"filters": "source!=Google;prop:plan!=pro"}), None)
    assert not touch_matches(parse_filters({"filters": "source~o"}), None)


def test_comparison_ranges():
    period = DateRange(date(2024, 2, 1), date(2024, 2, 29))
    assert comparison_range(period, "previous_period") == DateRange(date(2024, 1, 3),
                                                                    date(2024, 1, 31))
    assert comparison_range(period, "previous_year") == DateRange(date(2023, 2, 1),
                                                                  date(2023, 2, 28))
    with pytest.raises(InvalidReportParameter, match="too early"):
        comparison_range(DateRange(date(1, 1, 1), date(1, 1, 5)), "previous_period")


def test_week_and_month_buckets_are_cut_to_the_range():
    period = DateRange(date(2026, 9, 24), date(2026, 10, 6))  # Thursday to Tuesday
    weeks = buckets(period, "week")
    assert [(b.label, len(b.days)) for b in weeks] == [
        ("2026-09-24", 4), ("2026-09-28", 7), ("2026-10-05", 2)]
    months = buckets(period, "month")
    assert [(b.label, len(b.days)) for b in months] == [("2026-09-24", 7), ("2026-10-01", 6)]
    assert months[0].end_ms == day_start_ms(date(2026, 10, 1))
    assert [len(b.days) for b in buckets(DateRange(date.max, date.max), "week")] == [1]
    assert len(buckets(DateRange(date(2026, 9, 24), date(2026, 9, 24)), "hour")) == 24


def test_change_is_relative_except_for_ratios():
    now = {"visitors": 15, "bounce_rate": 0.5, "from": "x", "revenue": {"EUR": {"net": Decimal(3)}}}
    before = {"visitors": 10, "bounce_rate": 0.25, "revenue": {"EUR": {"net": Decimal(0)}}}
    assert change(now, before) == {"visitors": 0.5, "bounce_rate": 0.25,
                                   "revenue": {"EUR": {"net": None}}}
    assert change({"visitors": 2}, {"visitors": 3}) == {"visitors": -0.3333}


def test_revenue_per_bucket_by_hand():
    period = DateRange(date(2026, 9, 1), date(2026, 9, 2))
    day1, day2 = day_start_ms(date(2026, 9, 1)), day_start_ms(date(2026, 9, 2))
    day_buckets = buckets(period, "day")
    payments = [
        RevenuePayment("a", "charge", "EUR", Decimal("10.005"), day1, 2),
        RevenuePayment("a", "refund", "EUR", Decimal("5"), day2),
        RevenuePayment("b", "charge", "EUR", Decimal("1"), day2),
        RevenuePayment("b", "charge", "JPY", Decimal("100"), day2),
    ]
    first = {("a", "EUR"): day1 - 5, ("b", "EUR"): day2 + 1, ("b", "JPY"): day2 + 2}
    mrr = {day2: {("EUR", "a"): Decimal(120)}, day2 + 86_400_000: {("EUR", "b"): Decimal(12)}}
    rows = revenue_per_bucket(day_buckets, payments, first, mrr)
    assert rows == [
        {"EUR": {"net": Decimal("20.01"), "new_customers": 0, "mrr": Decimal("10.00")},
         "JPY": {"net": Decimal(0), "new_customers": 0, "mrr": Decimal(0)}},
        {"EUR": {"net": Decimal("-4.00"), "new_customers": 1, "mrr": Decimal("1.00")},
         "JPY": {"net": Decimal(100), "new_customers": 1, "mrr": Decimal(0)}},
    ]
    only_b = revenue_per_bucket(day_buckets, payments, first, mrr, keep=lambda c: c == "b")
    assert only_b[0]["EUR"] == {"net": Decimal("0.00"), "new_customers": 0, "mrr": Decimal("0.00")}
    assert only_b[1]["EUR"]["net"] == Decimal("1.00")


def test_mrr_series_kept_up_to_date_equals_each_instant_read_afresh():
    import random
    from collections import defaultdict

    from reports.money.mrr import (
        Observation,
        SubscriptionHistory,
        SubscriptionPayment,
        monthly_value,
    )
    from reports.money.mrr_series import values_at_instants

    rng = random.Random(14)
    hour = 3_600_000
    observations, payments = [], []
    for seq in range(300):
        sub = f"s{rng.randrange(40)}"
        at = rng.randrange(0, 200) * hour + rng.randrange(hour)
        started = at - rng.choice([0, 5 * hour, 50 * hour])
        ended = rng.choice([None, None, at + rng.randrange(-10, 60) * hour])
        observations.append(Observation(
            sub, f"c{int(sub[1:]) % 15}", rng.choice(["EUR", "USD"]), at,
            rng.choice(["active", "active", "past_due", "canceled", "trialing"]),
            rng.choice([None, Decimal(rng.randrange(1, 500)) / 4]),
            rng.choice([None, "day", "week", "month", "year"]), None, started, ended, seq))
        if rng.random() < 0.3:
            payments.append(SubscriptionPayment(sub, "EUR", Decimal(rng.randrange(1, 99)),
                                                at + hour, seq=seq))
    source = SubscriptionHistory(observations, payments)
    instants = sorted({rng.randrange(0, 260) * hour for _ in range(80)})
    series = values_at_instants(source, instants)
    for t in instants:
        afresh = defaultdict(Decimal)
        for state in source.states_at(t):
            value = monthly_value(state, t)
            if value is not None:
                afresh[(value.currency, value.customer_id)] += value.yearly
        assert {k: v for k, v in series[t].items() if v} == {k: v for k, v in afresh.items() if v}
