"""The period picker: named periods and custom ranges as report date ranges, pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from reports.shared.params import InvalidReportParameter, parse_date_range

PERIODS = (
    ("today", "Today"),
    ("7d", "7 days"),
    ("30d", "30 days"),
    ("month", "This month"),
    ("lastmonth", "Last month"),
    ("12mo", "12 months"),
)
DEFAULT_PERIOD = "30d"


@dataclass(frozen=True)
class Period:
    name: str  # one of PERIODS, or "custom"
    start: date
    end: date  # inclusive

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1

    @property
    def interval(self) -> str:
        if self.days == 1:
            return "hour"
        return "day" if self.days <= 92 else "month"

    def previous(self) -> Period:
        """The range of the same length just before this one."""
        end = self.start - timedelta(days=1)
        return Period(self.name, end - timedelta(days=self.days - 1), end)

    def params(self) -> dict[str, str]:
        return {"from": self.start.isoformat(), "to": self.end.isoformat()}

    def label(self) -> str:
        for name, text in PERIODS:
            if name == self.name:
                return text
        if self.start == self.end:
            return self.start.strftime("%-d %b %Y")
        return f"{self.start.strftime('%-d %b %Y')} – {self.end.strftime('%-d %b %Y')}"


def _month_start(day: date) -> date:
    return day.replace(day=1)


def resolve(query: dict[str, str], today: date) -> Period:
    """The period a page's query asks for; InvalidReportParameter for a bad custom range."""
    custom = bool(query.get("from") or query.get("to"))
    name = query.get("period") or ("custom" if custom else DEFAULT_PERIOD)
    if name == "custom":
        params = {k: query[k] for k in ("from", "to") if query.get(k)}
        if not params:
            raise InvalidReportParameter("a custom period needs a from or to date")
        period = parse_date_range(params, today)
        return Period("custom", period.start, period.end)
    if name == "today":
        return Period(name, today, today)
    if name == "7d":
        return Period(name, today - timedelta(days=6), today)
    if name == "month":
        return Period(name, _month_start(today), today)
    if name == "lastmonth":
        end = _month_start(today) - timedelta(days=1)
        return Period(name, _month_start(end), end)
    if name == "12mo":
        return Period(name, today - timedelta(days=364), today)
    if name == DEFAULT_PERIOD:
        return Period(name, today - timedelta(days=29), today)
    raise InvalidReportParameter(f"period: must be one of {', '.join(n for n, _ in PERIODS)} "
                                 f"or custom, not {name!r}")
