"""Jinja2 templates and static files, both package data of `dashboard`."""

from __future__ import annotations

import functools
import hashlib
import mimetypes
from decimal import Decimal
from importlib import resources

from reports.money.amounts import round_money

STATIC_FILES = (
    "app.css",
    "dashboard.js",
    "favicon.svg",
    "vendor/uplot/uPlot.iife.min.js",
    "vendor/uplot/uPlot.min.css",
)
CURRENCY_SIGNS = {"EUR": "€", "USD": "$", "GBP": "£", "JPY": "¥", "CHF": "CHF ", "CAD": "CA$",
                  "AUD": "A$", "INR": "₹", "BRL": "R$"}


@functools.cache
def static_file(name: str) -> tuple[bytes, str, str]:
    """(content, short digest, content type) of a file under dashboard/static."""
    if name not in STATIC_FILES:
        raise KeyError(name)
    data = resources.files("dashboard").joinpath("static", *name.split("/")).read_bytes()
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if kind.startswith("text/") or kind.endswith("javascript"):
        kind += "; charset=utf-8"
    return data, hashlib.sha256(data).hexdigest()[:16], kind


def static_url(name: str) -> str:
    """A URL that changes whenever the file does, so it may be cached for a year."""
    return f"/static/{static_file(name)[1]}/{name}"


def number(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def percent(value) -> str:
    if value is None:
        return "–"
    return f"{float(value) * 100:.1f}%".replace(".0%", "%")


def duration(seconds) -> str:
    if seconds is None:
        return "–"
    whole = int(round(float(seconds)))
    minutes, secs = divmod(whole, 60)
    if minutes >= 60:
        return f"{minutes // 60}h {minutes % 60:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def money(value, currency: str | None) -> str:
    if value is None:
        return "–"
    if currency is None:
        return number(value)
    amount = round_money(Decimal(str(value)), currency)
    sign = "-" if amount < 0 else ""
    places = -amount.as_tuple().exponent
    text = f"{abs(amount):,.{places}f}" if places > 0 else f"{abs(amount):,}"
    symbol = CURRENCY_SIGNS.get(currency)
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def change(value: float | None) -> str:
    if value is None:
        return ""
    if abs(value) < 0.0005:
        return "±0%"
    return f"{value * 100:+.0f}%" if abs(value) >= 0.1 else f"{value * 100:+.1f}%"


def raw(value) -> str:
    """data-value: the number as the report gives it."""
    return "" if value is None else str(value)


@functools.cache
def environment():
    # Imported on the first page: jinja2 is not needed by a worker that only ingests.
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(loader=PackageLoader("dashboard", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.globals["static"] = static_url
    env.filters.update(number=number, percent=percent, duration=duration, money=money,
                       change=change, raw=raw)
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)
