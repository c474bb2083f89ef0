"""MRR at a date and monthly MRR movements, from dated subscription observations."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.money.amounts import to_minor
from reports.money.mrr import (
    MOVEMENT_TYPES,
    Observation,
    SubscriptionHistory,
    SubscriptionPayment,
    month_windows,
    mrr_at,
    mrr_movements,
)
from reports.shared.params import DateRange, end_of_day_ms

D = Decimal


def ms(when: str) -> int:
    """'2026-02-10' or '2026-02-10T13:00' (UTC) in unix milliseconds."""
    text = when if "T" in when else when + "T12:00"
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def obs(sub, when, customer=None, currency="USD", **fields) -> Observation:
    amount = fields.pop("amount", None)
    for name in ("started_at", "ended_at"):
        if isinstance(fields.get(name), str):
            fields[name] = ms(fields[name])
    return Observation(sub, customer or "cust_" + sub, currency, ms(when),
                       amount=None if amount is None else D(amount), **fields)


def mrr(observations, day, payments=(), channels=None):
    return mrr_at(SubscriptionHistory(observations, payments), date.fromisoformat(day),
                  channels or {})


def usd_mrr(observations, day, payments=()):
    report = mrr(observations, day, payments)
    return report["USD"]["mrr"] if "USD" in report else D(0)


@pytest.mark.parametrize(
    ("interval", "amount", "currency", "expected"),
    [
        ("month", "30.00", "USD", "30.00"),
        ("year", "120.00", "USD", "10.00"),
        ("year", "100.00", "USD", "8.33"),  # 8.333...
        ("year", "0.30", "USD", "0.03"),  # 0.025 rounds half up
        ("week", "10.00", "USD", "43.33"),  # 10 x 52 / 12 = 43.333...
        ("day", "1.00", "USD", "30.42"),  # 365 / 12 = 30.4166...
        (None, "15.00", "USD", "15.00"),  # no interval means month
        ("year", "1000", "JPY", "83"),
        ("week", "1.000", "KWD", "4.333"),
    ],
)
def test_each_interval_is_normalised_to_a_month(interval, amount, currency, expected):
    report = mrr([obs("s1", "2026-01-05", currency=currency, amount=amount, interval=interval)],
                 "2026-01-31")
    assert str(report[currency]["mrr"]) == expected
    assert report[currency]["subscriptions"] == 1


def test_monthly_values_are_summed_exactly_before_rounding():
    # 43.333... + 30.4166... = 73.75 exactly; rounding each first would give 73.75 by luck,
    # but 3 x 8.333... = 25.00 exactly, where rounded parts give 24.99.
    observations = [obs("w", "2026-01-05", amount="10", interval="week"),
                    obs("d", "2026-01-05", amount="1", interval="day"),
                    *(obs(f"y{i}", "2026-01-05", amount="100", interval="year") for i in range(3))]
    report = mrr(observations, "2026-01-31")["USD"]
    assert report["mrr"] == D("98.75")
    assert report["arr"] == D("1185.00")


def test_arr_is_twelve_times_the_exact_mrr():
    report = mrr([obs("s", "2026-01-05", amount="100.00", interval="year")], "2026-01-31")["USD"]
    assert (str(report["mrr"]), str(report["arr"])) == ("8.33", "100.00")


@pytest.mark.parametrize(
    ("fields", "counts"),
    [
        ({"status": "active"}, True),
        ({"status": "past_due"}, True),
        ({"status": "trialing"}, False),
        ({"status": "paused"}, False),
        ({"status": "canceled"}, False),
        ({"status": "ended"}, False),
        ({"started_at": "2026-01-31T23:59"}, True),  # started on the day: counts
        ({"started_at": "2026-02-01T00:00"}, False),  # starts the next day
        ({"ended_at": "2026-01-31T23:59"}, False),  # ended on the day
        ({"ended_at": "2026-02-01T00:00"}, True),  # ends at the next day's start
        ({"ended_at": "2026-03-01"}, True),
        ({"status": "active", "started_at": "2025-12-01", "ended_at": "2026-01-10"}, False),
    ],
)
def test_which_states_count_at_the_end_of_a_day(fields, counts):
    observations = [obs("s", "2026-01-05", amount="20", **fields)]
    assert usd_mrr(observations, "2026-01-31") == (D(20) if counts else D(0))


def test_an_observation_counts_from_its_own_day():
    late = [obs("s", "2026-01-31T23:59", amount="20")]
    assert usd_mrr(late, "2026-01-30") == 0
    assert usd_mrr(late, "2026-01-31") == 20
    assert usd_mrr([obs("s", "2026-02-01T00:00", amount="20")], "2026-01-31") == 0


def test_status_changes_over_time_give_different_mrr_at_earlier_dates():
    observations = [
        obs("s", "2026-01-01", amount="50", plan="Pro"),
        obs("s", "2026-02-10", amount="80", plan="Business"),
        obs("s", "2026-03-05", amount="80", plan="Business", status="past_due"),
        obs("s", "2026-04-02", amount="80", plan="Business", status="canceled",
            ended_at="2026-04-30"),
    ]
    assert [usd_mrr(observations, day) for day in
            ("2025-12-31", "2026-01-31", "2026-02-28", "2026-03-31", "2026-04-15")] == [
        0, 50, 80, 80, 0]
    assert mrr(observations, "2026-01-31")["USD"]["by_plan"][0]["plan"] == "Pro"


def test_same_instant_observations_take_the_later_one():
    observations = [obs("s", "2026-01-05", amount="10", seq=2),
                    obs("s", "2026-01-05", amount="99", seq=1)]
    assert usd_mrr(observations, "2026-01-31") == 10


def test_missing_amount_falls_back_to_the_latest_succeeded_charge():
    observations = [obs("s", "2026-01-05")]  # no amount
    payments = [
        SubscriptionPayment("s", "USD", D("20"), ms("2026-01-05")),
        SubscriptionPayment("s", "USD", D("25"), ms("2026-02-05")),
        SubscriptionPayment("s", "USD", D("30"), ms("2026-03-05"), status="failed"),
        SubscriptionPayment("s", "USD", D("5"), ms("2026-03-06"), kind="refund"),
        SubscriptionPayment("s", "EUR", D("40"), ms("2026-03-07")),  # another currency
        SubscriptionPayment("other", "USD", D("70"), ms("2026-03-08")),
    ]
    assert [usd_mrr(observations, day, payments) for day in
            ("2026-01-04", "2026-01-20", "2026-02-15", "2026-03-31")] == [0, 20, 25, 25]
    yearly = [obs("s", "2026-01-05", interval="year")]
    assert usd_mrr(yearly, "2026-03-31", payments) == D("2.08")  # 25 / 12


def test_missing_amount_without_any_charge_counts_the_subscription_at_zero():
    report = mrr([obs("s", "2026-01-05")], "2026-01-31")["USD"]
    assert (report["mrr"], report["subscriptions"], report["customers"]) == (0, 1, 1)


def test_mrr_report_per_currency_channel_and_plan():
    observations = [
        obs("s1", "2026-01-02", customer="alice", amount="49", plan="Pro"),
        obs("s2", "2026-01-03", customer="alice", amount="120", interval="year", plan="Addon"),
        obs("s3", "2026-01-04", customer="bob", amount="49", plan="Pro"),
        obs("s4", "2026-01-05", customer="carol", amount="490", interval="year", plan="Pro"),
        obs("s5", "2026-01-06", customer="dave", amount="19", currency="EUR"),
        obs("s6", "2026-01-07", customer="erin", amount="29", currency="EUR", plan="Team"),
        obs("s7", "2026-01-08", customer="frank", amount="99", status="trialing"),
    ]
    channels = {"alice": "Organic Search", "bob": "Direct", "carol": "Organic Search"}
    report = mrr(observations, "2026-01-31", channels=channels)
    assert list(report) == ["EUR", "USD"]
    usd = report["USD"]
    # 49 + 10 + 49 + 40.8333... = 148.8333...
    assert (usd["mrr"], usd["arr"], usd["subscriptions"], usd["customers"]) == (
        D("148.83"), D("1786.00"), 4, 3)
    assert usd["by_channel"] == [
        {"channel": "Organic Search", "mrr": D("99.83"), "subscriptions": 3, "customers": 2},
        {"channel": "Direct", "mrr": D("49.00"), "subscriptions": 1, "customers": 1},
    ]
    assert usd["by_plan"] == [
        {"plan": "Pro", "mrr": D("138.83"), "subscriptions": 3, "customers": 3},
        {"plan": "Addon", "mrr": D("10.00"), "subscriptions": 1, "customers": 1},
    ]
    eur = report["EUR"]
    assert (eur["mrr"], eur["subscriptions"], eur["customers"]) == (D("48.00"), 2, 2)
    assert eur["by_channel"] == [
        {"channel": "Unattributed", "mrr": D("48.00"), "subscriptions": 2, "customers": 2}]
    assert eur["by_plan"] == [
        {"plan": "Team", "mrr": D("29.00"), "subscriptions": 1, "customers": 1},
        {"plan": None, "mrr": D("19.00"), "subscriptions": 1, "customers": 1},
    ]


def test_month_windows_are_clipped_to_the_range():
    period = DateRange(date(2026, 1, 20), date(2026, 3, 10))
    assert month_windows(period) == [
        (date(2026, 1, 20), date(2026, 1, 31)),
        (date(2026, 2, 1), date(2026, 2, 28)),
        (date(2026, 3, 1), date(2026, 3, 10)),
    ]
    assert month_windows(DateRange(date(2025, 12, 5), date(2025, 12, 5))) == [
        (date(2025, 12, 5), date(2025, 12, 5))]
    assert month_windows(DateRange(date(2025, 12, 5), date(2026, 1, 1))) == [
        (date(2025, 12, 5), date(2025, 12, 31)), (date(2026, 1, 1), date(2026, 1, 1))]
    assert month_windows(DateRange(date(9999, 11, 20), date(9999, 12, 31)))[-1] == (
        date(9999, 12, 1), date(9999, 12, 31))
    assert month_windows(DateRange(date(1, 1, 1), date(1, 2, 3)))[0] == (
        date(1, 1, 1), date(1, 1, 31))


MOVEMENT_HISTORY = [
    # USD
    obs("a", "2026-02-10", amount="30"),  # new in February
    obs("b", "2026-01-05", amount="50"),
    obs("b", "2026-02-15", amount="80"),  # expansion +30 in February
    obs("b", "2026-03-10", amount="80", ended_at="2026-03-15"),  # churn -80 in March
    obs("c", "2026-01-05", amount="40"),
    obs("c", "2026-02-20", amount="240", interval="year"),  # contraction to 20: -20
    obs("d", "2026-01-05", amount="25"),
    obs("d", "2026-02-25", amount="25", status="canceled"),  # churn -25 in February
    obs("e", "2026-01-03", amount="10"),
    obs("e", "2026-01-20", amount="10", status="canceled"),
    obs("e2", "2026-03-03", customer="cust_e", amount="10"),  # reactivation +10 in March
    obs("g1", "2026-01-05", customer="cust_g", amount="10"),
    obs("g2", "2026-03-08", customer="cust_g", amount="3", interval="week"),  # expansion +13
    # EUR, where thirds of a cent must still add up
    obs("j", "2026-01-05", currency="EUR", amount="100", interval="year"),
    obs("j", "2026-02-05", currency="EUR", amount="200", interval="year"),  # +8.333...
    obs("k", "2026-02-06", currency="EUR", amount="100", interval="year"),  # new 8.333...
]


def month(name, first, last, start, end, new="0", expansion="0", contraction="0", churn="0",
          reactivation="0"):
    return {"month": name, "from": first, "to": last, "start_mrr": D(start), "end_mrr": D(end),
            "new": D(new), "expansion": D(expansion), "contraction": D(contraction),
            "churn": D(churn), "reactivation": D(reactivation)}


def test_every_movement_type_with_hand_computed_values():
    history = SubscriptionHistory(MOVEMENT_HISTORY)
    report = mrr_movements(history, DateRange(date(2026, 2, 1), date(2026, 3, 31)))
    assert list(report) == ["EUR", "USD"]
    assert report["USD"]["months"] == [
        # Start: b 50 + c 40 + d 25 + g 10 = 125; end: a 30 + b 80 + c 20 + g 10 = 140.
        month("2026-02", "2026-02-01", "2026-02-28", "125", "140",
              new="30", expansion="30", contraction="-20", churn="-25"),
        # End: a 30 + c 20 + e 10 + g 23 = 83.
        month("2026-03", "2026-03-01", "2026-03-31", "140", "83",
              expansion="13", churn="-80", reactivation="10"),
    ]
    assert report["EUR"]["months"] == [
        # 8.33 -> 25.00: new and expansion are 8.333... each; the spare cent goes to new.
        month("2026-02", "2026-02-01", "2026-02-28", "8.33", "25.00",
              new="8.34", expansion="8.33"),
        month("2026-03", "2026-03-01", "2026-03-31", "25.00", "25.00"),
    ]


def test_movement_endpoints_agree_with_mrr_at_the_boundaries():
    history = SubscriptionHistory(MOVEMENT_HISTORY)
    rows = mrr_movements(history, DateRange(date(2026, 1, 15), date(2026, 3, 20)))["USD"]["months"]
    assert [(r["from"], r["to"]) for r in rows] == [
        ("2026-01-15", "2026-01-31"), ("2026-02-01", "2026-02-28"), ("2026-03-01", "2026-03-20")]
    for row in rows:
        before = date.fromordinal(date.fromisoformat(row["from"]).toordinal() - 1)
        assert row["start_mrr"] == mrr_at(history, before, {})["USD"]["mrr"]
        assert row["end_mrr"] == mrr_at(history, date.fromisoformat(row["to"]), {})["USD"]["mrr"]
    # 15 to 31 January: e churns (-10); the rest was there on the 14th.
    assert rows[0]["churn"] == D("-10") and rows[0]["start_mrr"] == D("135")
    # To 20 March: b ended on the 15th; the reactivation and g2 happened before the 20th.
    assert (rows[2]["end_mrr"], rows[2]["churn"]) == (D("83"), D("-80"))


def test_first_time_in_a_new_currency_is_new_not_reactivation():
    history = SubscriptionHistory([
        obs("s", "2026-01-05", customer="x", currency="USD", amount="10"),
        obs("s", "2026-02-05", customer="x", currency="EUR", amount="9"),
    ])
    report = mrr_movements(history, DateRange(date(2026, 2, 1), date(2026, 2, 28)))
    assert report["USD"]["months"][0]["churn"] == D("-10")
    assert report["EUR"]["months"][0]["new"] == D("9")


def test_a_trial_or_zero_amount_before_is_not_a_previous_subscription():
    history = SubscriptionHistory([
        obs("s", "2026-01-05", customer="x", amount="10", status="trialing"),
        obs("t", "2026-01-06", customer="x", amount="0"),
        obs("s", "2026-02-05", customer="x", amount="10"),
    ])
    report = mrr_movements(history, DateRange(date(2026, 2, 1), date(2026, 2, 28)))
    assert report["USD"]["months"][0]["new"] == D("10")


# Property checks: movements always add up, and first_positive agrees with brute force.
DAY = 86_400_000
T0 = ms("2026-01-01T00:00")
instants = st.integers(min_value=0, max_value=90).map(lambda d: T0 + d * DAY)
observation = st.builds(
    lambda sub, customer, currency, at, status, amount, interval, start, end, seq: Observation(
        sub, customer, currency, at, status, amount, interval, None, start, end, seq),
    st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["x", "y"]),
    st.sampled_from(["USD", "EUR"]), instants,
    st.sampled_from(["active", "past_due", "canceled", "trialing"]),
    st.one_of(st.none(), st.sampled_from([D("0"), D("10"), D("99.99"), D("100")])),
    st.sampled_from([None, "day", "week", "month", "year"]),
    st.one_of(st.none(), instants), st.one_of(st.none(), instants),
    st.integers(min_value=0, max_value=3),
)
charge = st.builds(
    lambda sub, currency, at, status: SubscriptionPayment(sub, currency, D("7.50"), at,
                                                          status=status),
    st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["USD", "EUR"]), instants,
    st.sampled_from(["succeeded", "failed"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(observation, max_size=8), st.lists(charge, max_size=4))
def test_movements_add_up_and_new_means_first_time(observations, payments):
    history = SubscriptionHistory(observations, payments)
    period = DateRange(date(2026, 1, 1), date(2026, 3, 31))
    for currency, report in mrr_movements(history, period).items():
        for row in report["months"]:
            total = sum(to_minor(row[kind], currency) for kind in MOVEMENT_TYPES)
            assert total == to_minor(row["end_mrr"], currency) - to_minor(row["start_mrr"],
                                                                          currency)
            assert row["churn"] <= 0 and row["contraction"] <= 0
            assert row["new"] >= 0 and row["expansion"] >= 0 and row["reactivation"] >= 0
    for sub_id in history.subscription_ids():
        candidates = sorted({o.observed_at + 1 for o in observations}
                            | {o.started_at + 1 for o in observations if o.started_at}
                            | {p.paid_at + 1 for p in payments})
        brute: dict = {}
        for t in candidates:
            value = history.value_at(sub_id, t)
            if value and value.monthly > 0:
                brute.setdefault((value.currency, value.customer_id), t)
        assert history.first_positive_of(sub_id) == brute


def test_first_positive_instant_of_a_fallback_amount():
    history = SubscriptionHistory(
        [obs("s", "2026-01-05")],
        [SubscriptionPayment("s", "USD", D("20"), ms("2026-01-09"))])
    assert history.first_positive_of("s") == {("USD", "cust_s"): ms("2026-01-09") + 1}
    assert history.value_at("s", end_of_day_ms(date(2026, 1, 9))).monthly == Fraction(20)
