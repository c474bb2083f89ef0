"""The figures of each page, asked of reports.service exactly as the Stats API asks them.

A report or parameter the service does not offer (yet) is skipped and named in
`missing`, so a page shows what exists and says what does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from dashboard.periods import Period
from reports.money.amounts import round_money
from reports.service import REPORTS, run_report
from reports.shared import params as report_params
from reports.shared.params import InvalidReportParameter
from storage.db import Database

TABLE_ROWS = 10
# (breakdown dimension, table title, column heading)
TRAFFIC_TABLES = (
    ("source", "Sources", "Source"),
    ("campaign", "Campaigns", "Campaign"),
    ("page", "Pages", "Page"),
    ("entry_page", "Entry pages", "Entry page"),
    ("country", "Countries", "Country"),
    ("device", "Devices", "Device"),
    ("browser", "Browsers", "Browser"),
    ("os", "Operating systems", "OS"),
)
# Lower is better for these: a fall shows as good news.
LOWER_IS_BETTER = {"bounce_rate"}


@dataclass
class Stat:
    name: str
    label: str
    kind: str
    value: object  # int, float or Decimal; None when there is nothing to show
    previous: object
    currency: str | None = None

    @property
    def change(self) -> float | None:
        """Relative change against the previous period, or None without a base."""
        if self.value is None or self.previous in (None, 0):
            return None
        return float((Decimal(str(self.value)) - Decimal(str(self.previous)))
                     / Decimal(str(self.previous)))

    @property
    def good(self) -> bool | None:
        change = self.change
        if change is None or change == 0:
            return None
        return (change < 0) if self.name in LOWER_IS_BETTER else (change > 0)


@dataclass
class Reports:
    """run_report for one site at one instant, remembering what it could not answer."""

    db: Database
    site_id: int
    now: float
    stores_segments: bool = True  # False for an anonymous viewer (a shared link)
    missing: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in REPORTS

    def get(self, name: str, params: Mapping[str, str], what: str | None = None) -> dict | None:
        if name not in REPORTS:
            self._note(what or f"the {name} report")
            return None
        clean = {k: v for k, v in params.items() if v not in (None, "")}
        try:
            return run_report(name, self.db, self.site_id, clean, self.now,
                              stores_segments=self.stores_segments)
        except InvalidReportParameter as exc:
            unknown = [k for k in clean if f"unknown parameter {k!r}" in str(exc)]
            if not unknown:
                raise
            # A parameter this build's reports do not take: answer without it.
            self._note(what or f"{unknown[0]}= on the {name} report")
            return self.get(name, {k: v for k, v in clean.items() if k not in unknown}, what)

    def _note(self, text: str) -> None:
        if text not in self.missing:
            self.missing.append(text)


def primary_currency(*reports: dict | None) -> str | None:
    """The currency with the most net revenue in the period, else the most MRR."""
    for report, figure in zip(reports, ("net", "mrr", "mrr"), strict=False):
        currencies = (report or {}).get("currencies") or {}
        if currencies:
            return max(sorted(currencies), key=lambda c: currencies[c].get(figure) or 0)
    return None


def _money(report: dict | None, currency: str | None, figure: str) -> Decimal | None:
    if report is None:
        return None
    if currency is None:  # no money in any currency yet
        return Decimal(0)
    entry = (report.get("currencies") or {}).get(currency)
    return Decimal(0) if entry is None else entry[figure]


def per_visitor(net: Decimal | None, visitors: int | None, currency: str | None) -> Decimal | None:
    """Net revenue / visitors, rounded half up once to the currency's minor unit."""
    if net is None or not visitors:
        return None if net is None else Decimal(0)
    if currency is None:
        return Decimal(0)
    return round_money(Fraction(net) / visitors, currency)


def dashboard_figures(reports: Reports, period: Period, *, filters: str, goal: str,
                      revenue: bool) -> dict:
    """Everything /sites/{id} and /share/{token} show for the period."""
    current = {**period.params(), "filters": filters}
    previous = {**period.previous().params(), "filters": filters}
    traffic = reports.get("aggregate", {**current, "goal": goal}) or {}
    traffic_before = reports.get("aggregate", {**previous, "goal": goal}) or {}
    stats = [
        Stat("visitors", "Visitors", "count", traffic.get("visitors"),
             traffic_before.get("visitors")),
        Stat("pageviews", "Pageviews", "count", traffic.get("pageviews"),
             traffic_before.get("pageviews")),
        Stat("bounce_rate", "Bounce rate", "ratio", traffic.get("bounce_rate"),
             traffic_before.get("bounce_rate")),
        Stat("visit_duration", "Visit duration", "seconds", traffic.get("avg_session_seconds"),
             traffic_before.get("avg_session_seconds")),
    ]
    money = {}
    currency = None
    if revenue:
        money["revenue"] = reports.get("revenue", current)
        money["revenue_before"] = reports.get("revenue", previous)
        money["mrr"] = reports.get("mrr", {"at": period.end.isoformat(), "filters": filters})
        money["mrr_before"] = reports.get(
            "mrr", {"at": period.previous().end.isoformat(), "filters": filters})
        currency = primary_currency(money["revenue"], money["mrr"], money["mrr_before"])
        net = _money(money["revenue"], currency, "net")
        net_before = _money(money["revenue_before"], currency, "net")
        stats += [
            Stat("revenue", "Net revenue", "money", net, net_before, currency),
            Stat("revenue_per_visitor", "Revenue per visitor", "money",
                 per_visitor(net, traffic.get("visitors"), currency),
                 per_visitor(net_before, traffic_before.get("visitors"), currency), currency),
            # Where the MRR report takes no filters, it is the whole site's: say so.
            Stat("mrr", "MRR (whole site)" if filters and "filters= on the mrr report"
                 in reports.missing else "MRR", "money",
                 _money(money["mrr"], currency, "mrr"),
                 _money(money["mrr_before"], currency, "mrr"), currency),
        ]
    if goal and "conversion_rate" in traffic:
        stats.append(Stat("conversion_rate", f"Conversion rate ({goal})", "ratio",
                          traffic.get("conversion_rate"),
                          traffic_before.get("conversion_rate")))
    elif goal:
        reports._note("goal= (conversion rate) on the aggregate report")
    return {
        "stats": stats,
        "currency": currency,
        "other_currencies": sorted(set((money.get("revenue") or {}).get("currencies", {}))
                                   - {currency}),
        "channels": channel_rows(reports, current, money.get("revenue"), currency),
        "tables": traffic_tables(reports, current, money.get("revenue"), currency),
        "goals": goal_rows(reports, current, currency if revenue else None),
        "series": series(reports, period, filters, revenue),
    }


def channel_rows(reports: Reports, params: dict, revenue: dict | None,
                 currency: str | None) -> list[dict]:
    """Visitors from the breakdown by channel; money, paying customers and conversion from
    the revenue report's rows by first-touch channel (its `by_channel` where the report has
    no per-row traffic figures: then conversion is customers / visitors)."""
    traffic = reports.get("breakdown", {**params, "by": "channel", "limit": "100"}) or {}
    money_rows = {}
    if revenue and currency:
        entry = revenue["currencies"].get(currency, {})
        for row in entry.get("rows") or entry.get("by_channel", []):
            money_rows[row.get("value", row.get("channel"))] = row
    rows = []
    for row in traffic.get("rows", []):
        money = money_rows.pop(row["value"], None)
        rows.append(_channel_row(row["value"], row["visitors"], money, revenue is not None))
    for name, money in money_rows.items():  # paying channels without visits in the period
        rows.append(_channel_row(name, 0, money, True))
    return rows


def _channel_row(name: str | None, visitors: int, money: dict | None, with_revenue: bool) -> dict:
    if not with_revenue:
        return {"value": name, "visitors": visitors, "revenue": None, "customers": None,
                "conversion": None}
    money = money or {}
    if "paying_customers" in money:
        customers, conversion = money["paying_customers"], money["conversion_rate"]
    else:
        customers = money.get("customers", 0)
        conversion = customers / visitors if visitors else None
    return {"value": name, "visitors": visitors, "revenue": money.get("net", Decimal(0)),
            "customers": customers, "conversion": conversion}


def traffic_tables(reports: Reports, params: dict, revenue: dict | None = None,
                   currency: str | None = None) -> list[dict]:
    tables = []
    for by, title, heading in TRAFFIC_TABLES:
        if by not in report_params.BREAKDOWN_DIMENSIONS:
            reports._note(f"the {title.lower()} breakdown (by={by})")
            continue
        # One more campaign than shown: visits without a campaign are not a row of its own.
        limit = TABLE_ROWS + (by == "campaign")
        data = reports.get("breakdown", {**params, "by": by, "limit": str(limit)}) or {}
        rows = data.get("rows", [])
        if by == "campaign":
            rows = [row for row in rows if row["value"] is not None][:TABLE_ROWS]
        table = {"by": by, "title": title, "heading": heading, "rows": rows}
        if by == "campaign" and revenue is not None:
            table = campaign_table(reports, params, table, currency)
        tables.append(table)
    return tables


def campaign_table(reports: Reports, params: dict, table: dict, currency: str | None) -> dict:
    """Every campaign with visitors (the traffic breakdown by=campaign), with the net
    revenue and paying customers its first-touched visitors brought (revenue by=campaign);
    a campaign that brought money but no visit in the period comes after them."""
    data = reports.get("revenue", {**params, "by": "campaign"}) if currency else None
    entry = ((data or {}).get("currencies") or {}).get(currency or "", {})
    money = {row["value"]: row for row in entry.get("rows", [])
             if row["value"] not in (None, "Unattributed")}
    rows = []
    for row in table["rows"]:
        paid = money.pop(row["value"], {})
        rows.append({**row, "revenue": paid.get("net", 0),
                     "customers": paid.get("paying_customers", 0)})
    for name, paid in money.items():
        rows.append({"value": name, "visitors": paid.get("visitors") or 0,
                     "revenue": paid["net"], "customers": paid.get("paying_customers")})
    return {**table, "rows": rows[:TABLE_ROWS], "money": True}


def goal_rows(reports: Reports, params: dict, currency: str | None) -> list[dict]:
    if reports.has("goals"):
        data = reports.get("goals", params) or {}
        rows = []
        for row in data.get("rows", data.get("goals", [])):
            net = None
            if currency is not None:
                net = (row.get("revenue") or {}).get(currency, {}).get("net") \
                    if isinstance(row.get("revenue"), dict) else row.get("revenue")
            rows.append({"value": row.get("goal", row.get("name")),
                         "visitors": row.get("conversions", row.get("visitors")),
                         "events": row.get("events"), "revenue": net})
        return rows
    reports._note("the goals report (conversions and revenue per custom event)")
    data = reports.get("breakdown", {**params, "by": "event", "limit": str(TABLE_ROWS)}) or {}
    return [{"value": r["value"], "visitors": r["visitors"], "events": r["events"],
             "revenue": None} for r in data.get("rows", []) if r["value"] != "pageview"]


def series(reports: Reports, period: Period, filters: str, revenue: bool) -> dict | None:
    """Visitors (and net revenue in the main currency) per bucket, for the chart."""
    if not reports.has("timeseries"):
        reports._note("the timeseries report (the chart)")
        return None
    data = reports.get("timeseries", {**period.params(), "interval": period.interval,
                                      "filters": filters}) or {}
    return {"interval": period.interval, "rows": data.get("rows", [])}
