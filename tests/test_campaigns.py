"""The traffic breakdown by the UTM parameters (by=medium, campaign, term, content) against
a reference computed from the visits sent, counted live, stored once final, and read back
by a restarted service; and the dashboard's Campaigns table listing every campaign with
visitors, paying or not."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import orjson
import webtest

from app import create_app
from tests.conftest import WAIT, bearer, config_for, rows
from tests.test_dashboard import sign_in, world, world_db  # noqa: F401, F811 - fixtures

DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
RANGE = "from=2026-09-21&to=2026-09-22"
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
UTM = ("medium", "campaign", "term", "content")
CHOICES = {"medium": ["email", "cpc", None], "campaign": ["autumn", "spring", "=sum(1)", None],
           "term": ["shoes", None], "content": ["banner", "link", None]}


def make_visits(seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    return [{"day": day, "ip": f"198.51.100.{n}", "pages": rng.randint(1, 3),
             **{utm: rng.choice(CHOICES[utm]) for utm in UTM}}
            for day in range(2) for n in range(1, 13)]


def reference(visits: list[dict], by: str) -> list[dict]:
    """Visitors per value (one visit a visitor a day: per day summed), and pageviews."""
    visitors, pageviews = defaultdict(set), defaultdict(int)
    for v in visits:
        visitors[v[by]].add((v["day"], v["ip"]))
        pageviews[v[by]] += v["pages"]
    ordered = sorted(visitors, key=lambda k: (-len(visitors[k]), k is None, k or ""))
    return [{"value": k, "visitors": len(visitors[k]), "pageviews": pageviews[k], "events": 0}
            for k in ordered]


def send_visits(client, site, tally, clock, visits) -> None:
    headers = bearer(site["key"])
    for day in range(2):
        clock.set(FIRST_DAY + day * DAY + 12 * 3600)
        start_ms = int(clock() * 1000) - 600_000
        batch = []
        for v in (v for v in visits if v["day"] == day):
            query = "&".join(f"utm_{utm}={v[utm]}" for utm in UTM if v[utm])
            query = "utm_source=news&" + query if query else ""
            for i in range(v["pages"]):
                url = "https://example.com/" + (f"p{i}" + (f"?{query}" if i == 0 and query else ""))
                batch.append({"e": "pageview", "u": url, "ts": start_ms + i * 30_000,
                              "ip": v["ip"], "ua": UA})
        client.post_json("/api/v1/events", {"s": site["site"]["id"], "b": batch},
                         headers=headers, status=204)
        assert tally.flusher.flush_now(timeout=WAIT)


def test_breakdown_by_utm_parameters(client, tally, site, clock, db_path):
    tally.start()
    visits = make_visits()
    send_visits(client, site, tally, clock, visits)
    headers = bearer(site["key"])

    def breakdowns(app_client) -> dict:
        return {by: app_client.get(f"/api/v1/stats/breakdown?by={by}&{RANGE}",
                                   headers=headers).json["data"]["rows"] for by in UTM}

    live = breakdowns(client)  # the second day is still open: counted live
    for by in UTM:
        assert live[by] == reference(visits, by), by
    campaign = client.get(f"/api/v1/stats/breakdown?by=campaign&{RANGE}&format=csv",
                          headers=headers).text
    assert "'=sum(1)" in campaign and campaign.startswith("value,visitors,pageviews,events")
    only = client.get(f"/api/v1/stats/breakdown?by=campaign&{RANGE}&filters=campaign==autumn",
                      headers=headers).json["data"]["rows"]
    assert only == [r for r in reference(visits, "campaign") if r["value"] == "autumn"]

    clock.set(FIRST_DAY + 4 * DAY)  # both days final: counted once more, then stored
    assert breakdowns(client) == live
    stored = rows(db_path, "SELECT DISTINCT dimension FROM traffic_segment_dimensions"
                           " WHERE segment = '*'")
    assert {r["dimension"] for r in stored} == set(UTM)
    tally.stop(timeout=5)

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        assert breakdowns(webtest.TestApp(restarted)) == live
    finally:
        restarted.stop(timeout=5)


def test_a_bad_breakdown_dimension_names_the_utm_ones(client, site):
    resp = client.get("/api/v1/stats/breakdown?by=utm_campaign", headers=bearer(site["key"]),
                      status=400)
    assert "campaign, term, content" in json.loads(resp.body)["error"]["message"]


def test_the_campaigns_table_lists_every_campaign_with_visitors(world):  # noqa: F811
    client, tally, site = world["client"], world["tally"], world["a"]
    tally.start()
    for n in (1, 2):
        client.post("/api/v1/events", orjson.dumps(
            {"s": site["site"], "e": "pageview", "ip": f"203.0.113.{50 + n}", "ua": UA,
             "u": "https://shop.test/?utm_source=partner&utm_campaign=spring"}),
            headers={**bearer(site["key"]), "Content-Type": "application/json"}, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    sign_in(client, "owner-a@example.com")
    page = client.get(f"/sites/{site['site']}")
    table = page.html.select_one("#t-campaign").find_parent("section")
    cells = [[c.text.strip() for c in tr.select("th, td")] for tr in table.select("tbody tr")]
    assert cells == [["spring", "2", "€0.00", "0"], ["autumn", "1", "€99.00", "1"]]
    assert "campaigns table" not in page.text
