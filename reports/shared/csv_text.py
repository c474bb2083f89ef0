"""Reports as CSV: a header row, then the same figures as the JSON, quoted per RFC 4180.

A text cell that comes from user data and starts with `=`, `+`, `-`, `@` (or a tab or
carriage return) gets a leading `'`, so a spreadsheet shows it instead of running it as a
formula. What a spreadsheet may skip or fold is judged as it would be (OWASP, CSV
injection): each leading character is normalised (NFKC: a full-width `＝` is `=`), and
blanks, control and format characters before the first other one (a NUL, a byte-order
mark, a zero-width space) are passed over. The cell itself is written unchanged but for
the `'`. Numbers are written as they are (a negative net stays -20.00).
"""

from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Iterable, MutableMapping, Sequence
from decimal import Decimal

from reports.shared.params import InvalidReportParameter

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_SKIPPED_CATEGORIES = ("Cc", "Cf")  # controls (NUL, ...) and format characters (BOM, ZWSP)
CSV_REPORTS = ("breakdown", "revenue", "timeseries", "funnel")
TRAFFIC = ("visitors", "pageviews", "sessions", "events", "bounce_rate", "avg_session_seconds")
GOAL = ("conversions", "conversion_rate", "goal_events")
REVENUE = ("gross", "refunds", "chargebacks", "fees", "net", "net_after_fees", "payments",
           "customers", "visitors", "paying_customers", "conversion_rate", "net_per_visitor")
BUCKET_REVENUE = ("net", "new_customers", "mrr")
FUNNEL = ("visitors", "conversion_rate", "dropoff", "dropoff_rate")


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Decimal):
        return format(value + 0, "f")
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    return "'" + text if looks_like_formula(text) else text


def looks_like_formula(text: str) -> bool:
    """Whether a spreadsheet could read the text as a formula (see the module's doc)."""
    if text.startswith(FORMULA_STARTS):
        return True
    for char in text:
        if char.isascii() and char.isalnum():
            return False
        for folded in unicodedata.normalize("NFKC", char):
            if folded.isspace() or unicodedata.category(folded) in _SKIPPED_CATEGORIES:
                continue
            return folded in "=+-@"
    return False


def write(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180: CRLF, quotes doubled
    writer.writerow(header)
    writer.writerows([cell(v) for v in row] for row in rows)
    return out.getvalue()


def breakdown_csv(data: dict) -> str:
    rows = data["rows"]
    columns = ["value", "visitors", "pageviews", "events"]
    if "goal" in data:
        columns += GOAL
    return write(columns, ([r.get(c) for c in columns] for r in rows))


def revenue_csv(data: dict) -> str:
    """One line per currency and value of `by` (the `rows` of each currency)."""
    header = ["currency", data.get("by", "channel"), *REVENUE]
    lines = ([currency, r["value"], *(r.get(c) for c in REVENUE)]
             for currency, figures in data["currencies"].items() for r in figures["rows"])
    return write(header, lines)


def timeseries_csv(data: dict) -> str:
    """One line per bucket; per currency seen, its net, new customers and MRR columns."""
    currencies = sorted({c for r in data["rows"] for c in r["revenue"]})
    traffic = [*TRAFFIC, *(GOAL if "goal" in data else ())]
    header = ["start", *traffic,
              *(f"{figure}_{currency}" for currency in currencies for figure in BUCKET_REVENUE)]
    lines = ([r["start"], *(r[c] for c in traffic),
              *(r["revenue"].get(currency, {}).get(figure)
                for currency in currencies for figure in BUCKET_REVENUE)]
             for r in data["rows"])
    return write(header, lines)


def funnel_csv(data: dict) -> str:
    """One line per step; a funnel that ends in payment adds, on the payment step's line,
    the net revenue and paying customers of each currency."""
    currencies = sorted(data.get("revenue", {}))
    header = ["step", *FUNNEL,
              *(f"{figure}_{currency}" for currency in currencies for figure in ("net", "customers"))]
    last = len(data["steps"]) - 1
    lines = ([r["step"], *(r[c] for c in FUNNEL),
              *(data["revenue"][currency][figure] if i == last else None
                for currency in currencies for figure in ("net", "customers"))]
             for i, r in enumerate(data["steps"]))
    return write(header, lines)


WRITERS = {"breakdown": breakdown_csv, "revenue": revenue_csv, "timeseries": timeseries_csv,
           "funnel": funnel_csv}


def as_csv(report: str, data: dict) -> str:
    return WRITERS[report](data)


def wants_csv(params: MutableMapping[str, object], accept: str | None) -> bool:
    """Takes `format` (json or csv) out of the parameters; without it, CSV when the Accept
    header names text/csv."""
    raw = params.pop("format", None)
    if raw is None:
        return accept is not None and "text/csv" in accept.lower()
    if raw not in ("json", "csv"):
        raise InvalidReportParameter("format: must be json or csv")
    return raw == "csv"
