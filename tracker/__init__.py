"""The browser tracking script, served at GET /js/tally.js (static/tally.js, package data)."""

from __future__ import annotations

from importlib import resources


def script_bytes() -> bytes:
    """The script as shipped: read from the installed package, wherever that lives."""
    return resources.files(__name__).joinpath("static/tally.js").read_bytes()
