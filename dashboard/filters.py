"""The `filters=` text of a page's URL (the reports' syntax), taken apart for display and
rebuilt when a row is clicked. The reports parse and check it; this only splits it."""

from __future__ import annotations

import re

OPERATORS = ("==", "!=", "~")
_SPLIT = re.compile(r"(?<!\\);")
LABELS = {"==": "is", "!=": "is not", "~": "contains"}


def escape(value: str) -> str:
    return re.sub(r"([\\;|=!~])", r"\\\1", value)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def split(filters: str) -> list[tuple[str, str, str, str]]:
    """[(dimension, operator, shown value, the filter's own text)] of a filters string."""
    parts = []
    for text in _SPLIT.split(filters or ""):
        if not text:
            continue
        match = re.match(r"(?:visit:|event:)?([A-Za-z_:]+?)(==|!=|~)(.*)", text, re.S)
        if match is None:
            parts.append((text, "", "", text))
            continue
        values = [_unescape(v) for v in re.split(r"(?<!\\)\|", match.group(3))]
        parts.append((match.group(1), match.group(2), " or ".join(values), text))
    return parts


def with_filter(filters: str, dimension: str, value: str) -> str:
    """The filters with `dimension==value` in place of any filter on that dimension."""
    kept = [text for dim, _, _, text in split(filters) if dim != dimension]
    return ";".join([*kept, f"{dimension}=={escape(value)}"])


def without(filters: str, text: str) -> str:
    return ";".join(t for _, _, _, t in split(filters) if t != text)
