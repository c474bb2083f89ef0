"""Pieces of the page URL and the referrer kept for reports and attribution."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

from vocabulary import CAMPAIGN_PARAMS

NO_CAMPAIGN = (None,) * len(CAMPAIGN_PARAMS)
# scheme://[userinfo@]host: group 1 is the host (any scheme: android-app:// referrers too).
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#@]*@)?(\[[^\]/?#]*\]|[^/?#:]+)")


def pathname(url: str, authority_end: int) -> str:
    """The path of a URL whose authority ends at `authority_end`, "/" when empty."""
    path = url[authority_end:]
    if "?" in path or "#" in path:  # cut at the first of them (str methods beat re here)
        path = path.partition("?")[0].partition("#")[0]
    return path or "/"


def campaign(url: str) -> tuple[str | None, ...]:
    """UTM parameters then click ids (CAMPAIGN_PARAMS order) from the query; first value wins."""
    start = url.find("?")
    if start < 0:
        return NO_CAMPAIGN
    fragment = url.find("#")
    if 0 <= fragment < start:
        return NO_CAMPAIGN
    query = url[start + 1:fragment] if fragment > 0 else url[start + 1:]
    if "utm_" not in query and "clid" not in query and "braid" not in query:
        return NO_CAMPAIGN
    found: dict[str, str] = {}
    for name, value in parse_qsl(query):
        if name in CAMPAIGN_PARAMS and name not in found and value:
            found[name] = value
    return tuple(found.get(name) for name in CAMPAIGN_PARAMS)


def url_host(url: str | None) -> str | None:
    """Lower-case host of an absolute URL without port or trailing dot; None if it has none."""
    if not url:
        return None
    match = _AUTHORITY.match(url)
    if match is None:
        return None
    return match.group(1).lower().rstrip(".") or None
