"""The `filters=`, `goal=` and `compare=` parameters of the reports, parsed without SQL.

Filters follow Plausible's form: `visit:source==Google;event:page==/pricing`. Each
filter is DIMENSION OPERATOR VALUES, filters are separated by `;` and all must hold.
Operators: `==` (equals), `!=` (does not equal; a missing value counts as not equal),
`~` (contains, ignoring case). VALUES is one value or several separated by `|` (any of
them). A `\\` makes the next character plain (`a\\;b` is the value `a;b`). The prefixes
`visit:` and `event:` may be left out; `prop:KEY` (or `event:props:KEY`) filters on a
custom event property.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta

from reports.shared.params import DateRange, InvalidReportParameter

# Dimensions fixed by a session's first event, and those read from each event.
SESSION_FILTERS = ("channel", "source", "medium", "campaign", "entry_page")
EVENT_FILTERS = ("page", "hostname", "country", "device", "browser", "os", "event")
FILTER_DIMENSIONS = (*SESSION_FILTERS, *EVENT_FILTERS)
OPERATORS = ("==", "!=", "~")
MAX_FILTERS = 10
MAX_VALUES = 50
MAX_FILTERS_LENGTH = 1000
MAX_VALUE_LENGTH = 500
_PROP_KEY = re.compile(r"[^\x00-\x1f\ud800-\udfff]{1,100}")
_GOAL_NAME = re.compile(r"[^\x00-\x1f\ud800-\udfff]{1,64}")
COMPARISONS = ("previous_period", "previous_year")


@dataclass(frozen=True)
class Filter:
    dimension: str  # one of FILTER_DIMENSIONS, or "prop"
    operator: str  # one of OPERATORS
    values: tuple[str, ...]
    prop: str | None = None  # the property key of a "prop" filter

    @property
    def is_session(self) -> bool:
        return self.dimension in SESSION_FILTERS

    def text(self) -> str:
        name = f"prop:{self.prop}" if self.dimension == "prop" else self.dimension
        return name + self.operator + "|".join(_escape(v) for v in self.values)


@dataclass(frozen=True)
class Goal:
    """A custom event by name, or (kind "page") a pageview of a pathname."""

    kind: str  # "event" or "page"
    name: str

    def text(self) -> str:
        return f"page:{self.name}" if self.kind == "page" else self.name


def _escape(value: str) -> str:
    return re.sub(r"([\\;|])", r"\\\1", value)


def _split(text: str, separator: str) -> list[str]:
    """Split on an unescaped separator, keeping escapes for the next step."""
    parts, current, i = [], [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _dimension(name: str, raw: str) -> tuple[str, str | None]:
    for prefix in ("visit:", "event:"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(("prop:", "props:")):
        key = name.split(":", 1)[1]
        if not _PROP_KEY.fullmatch(key):
            raise InvalidReportParameter(
                f"filters: {raw!r} needs a property key of 1 to 100 characters after prop:")
        return "prop", key
    if name == "name":  # Plausible's event:name
        name = "event"
    if name not in FILTER_DIMENSIONS:
        raise InvalidReportParameter(
            f"filters: unknown dimension {name!r} in {raw!r}; use one of "
            f"{', '.join(FILTER_DIMENSIONS)} or prop:KEY")
    return name, None


def parse_filter(raw: str) -> Filter:
    match = re.search(r"==|!=|~", raw)
    if match is None:
        raise InvalidReportParameter(
            f"filters: {raw!r} has no operator; write DIMENSION==VALUE, != or ~")
    name, operator = raw[:match.start()].strip(), match.group()
    dimension, prop = _dimension(name, raw)
    values = tuple(_unescape(v) for v in _split(raw[match.end():], "|"))
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for v in values for c in v):
        raise InvalidReportParameter(f"filters: a value of {name!r} has a control character")
    if any(v == "" for v in values):
        raise InvalidReportParameter(f"filters: {raw!r} has an empty value")
    if len(values) > MAX_VALUES:
        raise InvalidReportParameter(f"filters: {raw!r} lists more than {MAX_VALUES} values")
    if any(len(v) > MAX_VALUE_LENGTH for v in values):
        raise InvalidReportParameter(
            f"filters: a value of {name!r} is longer than {MAX_VALUE_LENGTH} characters")
    return Filter(dimension, operator, tuple(sorted(set(values))), prop)


def parse_filters(params: Mapping[str, object]) -> tuple[Filter, ...]:
    """The filters, in a canonical order (so equal filters make equal segments)."""
    raw = params.get("filters")
    if raw is None:
        return ()
    if isinstance(raw, (list, tuple)):
        raise InvalidReportParameter("filters: give it at most once; join filters with ;")
    text = str(raw)
    if len(text) > MAX_FILTERS_LENGTH:
        raise InvalidReportParameter(f"filters: longer than {MAX_FILTERS_LENGTH} characters")
    parts = [p for p in _split(text, ";")]
    if any(not p.strip() for p in parts):
        raise InvalidReportParameter("filters: empty filter; separate filters with one ;")
    if len(parts) > MAX_FILTERS:
        raise InvalidReportParameter(f"filters: at most {MAX_FILTERS} filters")
    filters = {parse_filter(p) for p in parts}
    return tuple(sorted(filters, key=Filter.text))


def parse_goal(params: Mapping[str, object]) -> Goal | None:
    raw = params.get("goal")
    if raw is None:
        return None
    if isinstance(raw, (list, tuple)):
        raise InvalidReportParameter("goal: give it at most once")
    text = str(raw)
    kind, name = ("page", text[5:]) if text.startswith("page:") else ("event", text)
    if kind == "page" and not name.startswith("/"):
        raise InvalidReportParameter(f"goal: page:{name} must name a path starting with /")
    if not _GOAL_NAME.fullmatch(name) or name == "pageview" and kind == "event":
        raise InvalidReportParameter(
            "goal: must be a custom event name (1 to 64 characters) or page:/PATH")
    return Goal(kind, name)


def segment_key(filters: tuple[Filter, ...], goal: Goal | None) -> str:
    """One text per distinct (filters, goal): the key of the stored days of a segment."""
    key = ";".join(f.text() for f in filters) + ("#goal=" + goal.text() if goal else "")
    return key or "*"


def parse_compare(params: Mapping[str, object]) -> str | None:
    raw = params.get("compare")
    if raw is None:
        return None
    if raw not in COMPARISONS:
        raise InvalidReportParameter(f"compare: must be one of {', '.join(COMPARISONS)}")
    return str(raw)


def _year_before(day: date) -> date:
    try:
        return day.replace(year=day.year - 1)
    except ValueError:  # 29 February
        return day.replace(year=day.year - 1, day=28)


def comparison_range(period: DateRange, compare: str) -> DateRange:
    """previous_period: as many days, ending the day before `from`; previous_year: the same
    dates a year earlier (29 February becomes the 28th)."""
    if period.start.year < 2 or period.start.toordinal() <= period.days:
        raise InvalidReportParameter("compare: the range is too early to compare with")
    if compare == "previous_period":
        end = period.start - timedelta(days=1)
        return DateRange(end - timedelta(days=period.days - 1), end)
    return DateRange(_year_before(period.start), _year_before(period.end))


# One meaning per rule, whichever engine and whichever report: traffic (through
# reports.segments.queries.resolve, which matches the values the engine stores) and revenue
# by first touch (touch_matches) both decide with these functions.

def contains(value: str, wanted: str) -> bool:
    """`~`: whether `value` contains `wanted`, ignoring case as Python's str.lower() does
    (every Unicode letter, not only ASCII: `page~über` keeps /Über)."""
    return wanted.lower() in value.lower()


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _number(value) -> float | None:
    """The value a property holds as a number, a double as JSON numbers are read: a number,
    or a text that spells a JSON number (the text PostgreSQL keeps of a stored number)."""
    if isinstance(value, bool):
        return float(value)  # SQLite's json_each gives true as 1
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and _JSON_NUMBER.fullmatch(value):
        return float(value)
    return None


def prop_equal(value, wanted: str) -> bool:
    """`prop:` `==`: whether a stored property value (a str, or a number as SQLite's
    json_each gives it) is the filter's `wanted`: the same text, or numbers of the same
    value (1e20 and 100000000000000000000 are one value)."""
    if isinstance(value, str) and value == wanted:
        return True
    number = _number(value)
    return number is not None and number == _number(wanted)


def _value_matches(f: Filter, value: str | None) -> bool:
    if f.operator == "==":
        return value is not None and value in f.values
    if f.operator == "!=":
        return value is None or value not in f.values
    return value is not None and any(contains(value, v) for v in f.values)


def _prop_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "1" if value else "0"  # SQLite's json_each gives true as 1
    return format(value)


def touch_matches(filters: tuple[Filter, ...], touch: Mapping[str, object] | None) -> bool:
    """Whether a customer's first touch passes every filter. `touch` maps each filter
    dimension to the first-touch session's value (event dimensions: its first event's)
    and "props" to that event's properties; None (no first touch) has no value at all."""
    touch = touch or {}
    for f in filters:
        if f.dimension == "prop":
            props = touch.get("props") or {}
            raw = props.get(f.prop)
            value = None if raw is None else _prop_text(raw)
            equal = value is not None and any(prop_equal(raw, v) for v in f.values)
            if f.operator == "!=":
                if equal:
                    return False
                continue
            if f.operator == "==" and not equal:
                return False
            if f.operator == "~" and not _value_matches(f, value):
                return False
        elif not _value_matches(f, touch.get(f.dimension)):
            return False
    return True
