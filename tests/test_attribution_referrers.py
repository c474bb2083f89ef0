"""A few hundred real referrer URLs -> source and channel, from tests/data/referrers.tsv.

Each URL goes the way a pageview's `r` does: enrichment.urls.url_host, then
attribution.classify_visit with no UTM values and no click ids.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from attribution import classify_visit
from enrichment.urls import url_host

SITE = ("example.com", "www.example.com")
TABLE = Path(__file__).resolve().parent / "data" / "referrers.tsv"


def _rows() -> list[tuple[str, str | None, str]]:
    with open(TABLE, encoding="utf-8", newline="") as handle:
        lines = (line for line in handle if not line.startswith("#"))
        reader = csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [(row["referrer"], row["source"] or None, row["channel"]) for row in reader]


ROWS = _rows()


def test_the_table_is_a_few_hundred_urls_of_every_kind():
    assert len(ROWS) >= 300
    assert len({url for url, _, _ in ROWS}) == len(ROWS)
    channels = {channel for _, _, channel in ROWS}
    assert {"Organic Search", "Organic Social", "Organic Video", "Organic Shopping",
            "AI Assistants", "Referral", "Direct"} <= channels


@pytest.mark.parametrize(("referrer", "source", "channel"), ROWS, ids=[r[0][:80] for r in ROWS])
def test_referrer_url(referrer, source, channel):
    touch = classify_visit(url_host(referrer), {}, (), SITE)
    assert (touch.source, touch.channel) == (source, channel)
