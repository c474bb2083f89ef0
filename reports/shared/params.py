"""Query parameters of the report endpoints and commands, checked without Falcon.

Dates are inclusive UTC calendar days written YYYY-MM-DD. A day D covers the
instants [D 00:00, D+1 00:00) UTC; "at D" means the end of day D, so a report
at D counts everything dated before D+1 00:00.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime

from vocabulary import DAY_MS

DEFAULT_DAYS = 30
MAX_DAYS = 366
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
BREAKDOWN_DIMENSIONS = (
    "channel", "source", "page", "entry_page", "country", "device", "browser", "os", "event",
    "medium", "campaign", "term", "content",
)
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_LIMIT = re.compile(r"\d{1,7}")


class InvalidReportParameter(ValueError):
    """A report parameter is missing its form or out of bounds; str() is the message to show."""


@dataclass(frozen=True)
class DateRange:
    start: date
    end: date  # inclusive

    @property
    def start_ms(self) -> int:
        return day_start_ms(self.start)

    @property
    def end_ms(self) -> int:
        """The first instant after the range (exclusive bound)."""
        return day_start_ms(self.end) + DAY_MS

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1


def day_start_ms(day: date) -> int:
    """Unix milliseconds of the day's 00:00 UTC."""
    return (day.toordinal() - _EPOCH_ORDINAL) * DAY_MS


def end_of_day_ms(day: date) -> int:
    """The instant that ends the day (the next day's 00:00 UTC), as an exclusive bound."""
    return day_start_ms(day) + DAY_MS


def utc_today(now: float | Callable[[], float]) -> date:
    """The UTC date of a unix time, or of what a clock says now."""
    return datetime.fromtimestamp(now() if callable(now) else now, UTC).date()


def check_known(params: Mapping[str, object], allowed: Collection[str]) -> None:
    """Refuse a parameter the report does not take (a typo would otherwise be ignored)."""
    for name in sorted(params):
        if name not in allowed:
            raise InvalidReportParameter(
                f"unknown parameter {name!r}; this report takes "
                f"{', '.join(allowed) or 'no parameters'}")


def _single(params: Mapping[str, object], name: str) -> str | None:
    """The parameter's one value; absent means "use the default", empty is a bad value."""
    value = params.get(name)
    if isinstance(value, (list, tuple)):
        raise InvalidReportParameter(f"{name}: give it at most once")
    return None if value is None else str(value)


def parse_date(name: str, raw: str) -> date:
    if not _DATE.fullmatch(raw):
        raise InvalidReportParameter(f"{name}: must be a UTC date YYYY-MM-DD, not {raw!r}")
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise InvalidReportParameter(f"{name}: {raw!r} is not a calendar date") from None


def parse_date_range(params: Mapping[str, object], today: date) -> DateRange:
    """`from`/`to`, inclusive; by default the 30 days ending today (or ending `to`)."""
    raw_from, raw_to = _single(params, "from"), _single(params, "to")
    end = parse_date("to", raw_to) if raw_to is not None else today
    # The default window is cut at 0001-01-01 rather than overflowing past it.
    default_start = date.fromordinal(max(1, end.toordinal() - (DEFAULT_DAYS - 1)))
    start = parse_date("from", raw_from) if raw_from is not None else default_start
    if start > end:
        raise InvalidReportParameter(f"from: {start} is after to {end}")
    if (end - start).days + 1 > MAX_DAYS:
        raise InvalidReportParameter(f"from/to: the range covers more than {MAX_DAYS} days")
    return DateRange(start, end)


def parse_at(params: Mapping[str, object], today: date) -> date:
    raw = _single(params, "at")
    return parse_date("at", raw) if raw is not None else today


def parse_limit(params: Mapping[str, object]) -> int:
    raw = _single(params, "limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not _LIMIT.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidReportParameter(f"limit: must be a whole number from 1 to {MAX_LIMIT}")
    return int(raw)


def parse_dimension(params: Mapping[str, object]) -> str:
    raw = _single(params, "by")
    if raw not in BREAKDOWN_DIMENSIONS:
        raise InvalidReportParameter(f"by: must be one of {', '.join(BREAKDOWN_DIMENSIONS)}")
    return raw


def parse_choice(params: Mapping[str, object], name: str, choices: Collection[str],
                 default: str) -> str:
    raw = _single(params, name)
    if raw is None:
        return default
    if raw not in choices:
        raise InvalidReportParameter(f"{name}: must be one of {', '.join(choices)}")
    return raw
