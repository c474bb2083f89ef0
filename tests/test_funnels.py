"""Funnels over HTTP against a reference computed in Python from the events and payments
sent (random visits, both backends); the steps' errors; stored funnels through the API,
read back by a restarted service; CSV.

Each visitor (an ip, one user agent, no cookie: a visitor id lives one UTC day) makes one
or two visits a day, hours apart, of events 20 s apart, so the reference knows every visit
without a sessionizer: a visit is (ip, day, visit number), a visitor (ip, day).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from fnmatch import fnmatchcase
from urllib.parse import quote

import orjson
import pytest
import webtest

from app import create_app
from tests.conftest import (
    WAIT,
    bearer,
    cli_json,
    config_for,
    execute,
    is_postgres,
    latest_version,
    run_cli,
)

DAY = 86_400
FIRST_DAY = 1_789_948_800  # 2026-09-21T00:00:00Z
DAYS = 3  # sent; the range covers the first two
RANGE = "from=2026-09-21&to=2026-09-22"
RANGE_END = FIRST_DAY + 2 * DAY
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
PAGES = ["/", "/pricing", "/docs/a", "/docs/b", "/signup", "/blog/x"]
GOALS = ["signup", "trial"]
FUNNELS = [
    "page:/,page:/pricing",
    "page:/docs/*,goal:signup,payment",
    "page:/,goal:signup,page:/pricing,payment",
    "page:/*,goal:trial",
    "goal:signup,payment",
    "page:/pricing,page:/,page:/pricing,goal:signup,goal:trial,page:/*a,page:/signup,payment",
]


def make_world(seed: int) -> tuple[list[dict], list[dict]]:
    """(visits, payments): visits with their events and identified users; customers'
    charges and refunds at random times, some outside the range."""
    rng = random.Random(seed)
    visits = []
    for day in range(DAYS):
        for n in range(1, 15):
            for number in range(rng.choice([1, 1, 2])):
                start = FIRST_DAY + day * DAY + (9 + 5 * number) * 3600 + rng.randint(0, 1800)
                events = []
                for i in range(rng.randint(1, 7)):
                    if rng.random() < 0.25:
                        events.append(("custom", rng.choice(GOALS), start + 20 * i))
                    else:
                        events.append(("pageview", rng.choice(PAGES), start + 20 * i))
                if events[0][0] == "custom":  # a visit starts on a page
                    events.insert(0, ("pageview", "/", start - 20))
                uid = f"user-{n}" if rng.random() < 0.4 else None
                visits.append({"ip": f"198.51.100.{n}", "day": day, "number": number,
                               "google": rng.random() < 0.5, "events": events, "uid": uid})
    payments = []
    for n in range(1, 15):
        for k in range(rng.randint(0, 3)):
            at = FIRST_DAY + rng.randint(0, DAYS * DAY - 60)
            kind = "refund" if k and rng.random() < 0.3 else "charge"
            payments.append({"id": f"pay_{n}_{k}", "customer": f"cus_{n}", "uid": f"user-{n}",
                             "amount": Decimal(rng.choice(["10", "25.5", "99.99"])),
                             "currency": rng.choice(["EUR", "EUR", "USD"]), "kind": kind,
                             "at": at})
    return visits, payments


def does(step: str, event: tuple) -> bool:
    kind, value, _ = event
    if step.startswith("goal:"):
        return kind == "custom" and value == step[5:]
    pattern = step[5:]
    return kind == "pageview" and fnmatchcase(value, pattern.replace("[", "[[]"))


def rate(part: int, whole: int) -> Decimal:
    """part / whole to four decimals, half up (as the JSON reads: parse_float=Decimal)."""
    if not whole:
        return Decimal(0)
    return (Decimal(part) / Decimal(whole)).quantize(Decimal("0.0001"), ROUND_HALF_UP)


def reference(visits: list[dict], payments: list[dict], steps: list[str],
              keep=lambda visit: True) -> dict:
    start, end = FIRST_DAY, RANGE_END
    in_range = [v for v in visits if start <= v["events"][0][2] < end and keep(v)]
    visit_steps = [s for s in steps if s != "payment"]
    reached = [set() for _ in steps]
    ready = []  # (visitor, time step n-1 was reached) for a funnel ending in payment
    for v in in_range:
        count, at = 0, None
        for event in v["events"]:
            if count < len(visit_steps) and does(visit_steps[count], event):
                count, at = count + 1, event[2]
        for i in range(count):
            reached[i].add((v["ip"], v["day"]))
        if count == len(visit_steps):
            ready.append(((v["ip"], v["day"]), at))
    answer = {}
    if steps[-1] == "payment":
        # A customer is linked to the visitor ids its user id was identified under.
        uids = defaultdict(set)
        for v in visits:
            if v["uid"]:
                uids[(v["ip"], v["day"])].add(v["uid"])
        paying = set()
        for visitor, at in ready:
            for p in payments:
                if (p["uid"] in uids[visitor] and p["kind"] == "charge" and at < p["at"]
                        and start <= p["at"] < end):
                    reached[-1].add(visitor)
                    paying.add(p["customer"])
        net = defaultdict(lambda: defaultdict(Decimal))
        for p in payments:
            if p["customer"] in paying and start <= p["at"] < end:
                net[p["currency"]][p["customer"]] += p["amount"] * (
                    1 if p["kind"] == "charge" else -1)
        answer["revenue"] = {currency: {"net": sum(by.values()), "customers": len(by)}
                             for currency, by in sorted(net.items())}
    first = len(reached[0])
    rows, before = [], first
    for step, visitors in zip(steps, reached, strict=True):
        n = len(visitors)
        rows.append({"step": step, "visitors": n,
                     "conversion_rate": rate(n, first), "dropoff": before - n,
                     "dropoff_rate": rate(before - n, before)})
        before = n
    return {"steps": rows, **answer}


def send_world(client, tally, clock, site, visits, payments) -> None:
    headers = bearer(site["key"])
    for day in range(DAYS):
        for v in sorted((v for v in visits if v["day"] == day), key=lambda v: v["events"][0][2]):
            clock.set(v["events"][-1][2] + 60)  # events may be dated up to an hour back
            batch = []
            who = {"ip": v["ip"], "ua": UA}
            for i, (kind, value, at) in enumerate(v["events"]):
                body = {"e": "pageview" if kind == "pageview" else value, "ts": at * 1000,
                        "u": "https://example.com" + (value if kind == "pageview" else "/app"),
                        **who}
                if i == 0 and v["google"]:
                    body["r"] = "https://www.google.com/"
                batch.append(body)
            if v["uid"]:
                batch.append({"e": "$identify", "uid": v["uid"], "ts": v["events"][-1][2] * 1000,
                              "u": "https://example.com/app", **who})
            client.post_json("/api/v1/events", {"s": site["site"]["id"], "b": batch},
                             headers=headers, status=204)
        assert tally.flusher.flush_now(timeout=WAIT)
    clock.set(FIRST_DAY + DAYS * DAY + 3600)
    for p in payments:
        paid_at = datetime.fromtimestamp(p["at"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        client.post("/api/v1/payments", orjson.dumps(
            {"payment_id": p["id"], "amount": float(p["amount"]), "currency": p["currency"],
             "kind": p["kind"], "paid_at": paid_at,
             "customer": {"id": p["customer"], "user_id": p["uid"]}}),
            headers={**headers, "Content-Type": "application/json"}, status=200)


@pytest.fixture
def world(client, tally, site, clock):
    tally.start()
    visits, payments = make_world(seed=11)
    send_world(client, tally, clock, site, visits, payments)
    headers = bearer(site["key"])

    def get(path, status=200, app=client):
        resp = app.get(path, headers=headers, expect_errors=True)
        assert resp.status_int == status, resp.body
        return json.loads(resp.body, parse_float=Decimal) if status != 204 else None

    return {"visits": visits, "payments": payments, "get": get, "headers": headers,
            "client": client}


def funnel_data(world, steps: str, extra: str = "", app=None) -> dict:
    kwargs = {"app": app} if app else {}
    data = world["get"](f"/api/v1/stats/funnel?steps={quote(steps, safe=',:/*')}&{RANGE}{extra}",
                        **kwargs)["data"]
    return data


def expected_of(data: dict) -> dict:
    return {k: v for k, v in data.items() if k in ("steps", "revenue")}


@pytest.mark.parametrize("steps", FUNNELS)
def test_a_funnel_matches_the_reference(world, steps):
    data = funnel_data(world, steps)
    assert (data["from"], data["to"]) == ("2026-09-21", "2026-09-22")
    expected = reference(world["visits"], world["payments"], steps.split(","))
    assert expected_of(data) == expected
    assert expected["steps"][0]["visitors"] > 0


def test_the_reference_sees_conversions_and_payments(world):
    """The random world exercises every branch: visitors at every step of a short funnel,
    and paying customers at the end of one."""
    short = reference(world["visits"], world["payments"], ["page:/", "page:/pricing"])
    assert short["steps"][1]["visitors"] > 0
    paid = reference(world["visits"], world["payments"], ["goal:signup", "payment"])
    assert paid["steps"][1]["visitors"] > 0 and paid["revenue"]


def test_filters_keep_the_visits_that_pass_them(world):
    steps = "page:/,goal:signup,payment"
    data = funnel_data(world, steps, "&filters=" + quote("channel==Organic Search"))
    expected = reference(world["visits"], world["payments"], steps.split(","),
                         keep=lambda v: v["google"])
    assert data["filters"] == "channel==Organic Search"
    assert expected_of(data) == expected
    assert data["steps"][0]["visitors"] < funnel_data(world, steps)["steps"][0]["visitors"]


@pytest.mark.parametrize(("query", "message"), [
    ("steps=page:/", "steps: a funnel has 2 to 8 steps, not 1"),
    ("steps=" + ",".join(["page:/"] * 9), "steps: a funnel has 2 to 8 steps, not 9"),
    ("steps=page:/,signup", "steps: 'signup' is not a step; write page:/PATH"),
    ("steps=page:pricing,goal:x", "steps: 'page:pricing' must name a path starting with /"),
    ("steps=page:/,goal:", "steps: 'goal:' must name a custom event (1 to 64 characters)"),
    ("steps=payment,page:/", "steps: payment can only be the last step"),
    ("", "steps: give steps (2 to 8, separated by commas"),
    ("steps=page:/,page:/x&funnel=a", "steps: give steps (2 to 8"),
    ("funnel=nope", "funnel: this site has no funnel named 'nope'"),
    ("steps=page:/,page:/x&by=page", "unknown parameter 'by'"),
    ("steps=page:/,page:/x&from=2026-09-22&to=2026-09-21", "from: 2026-09-22 is after to"),
])
def test_a_bad_funnel_is_400_with_what_is_wrong(client, site, query, message):
    resp = client.get(f"/api/v1/stats/funnel?{query}", headers=bearer(site["key"]),
                      expect_errors=True)
    assert resp.status_int == 400
    body = resp.json
    assert body["ok"] is False and body["error"]["code"] == "invalid_input"
    assert body["error"]["message"].startswith(message), body["error"]["message"]


def test_funnel_csv(world):
    steps = "page:/,goal:signup,payment"
    data = funnel_data(world, steps)
    lines = funnel_csv_text(world, steps).strip().split("\r\n")
    currencies = sorted(data["revenue"])
    assert lines[0] == ",".join(["step", "visitors", "conversion_rate", "dropoff",
                                 "dropoff_rate", *(f"{f}_{c}" for c in currencies
                                                   for f in ("net", "customers"))])
    assert len(lines) == 4 and lines[3].startswith("payment,")
    first = data["steps"][0]
    assert lines[1].startswith(f"page:/,{first['visitors']},")


def funnel_csv_text(world, steps: str) -> str:
    client = world["client"]
    return client.get(f"/api/v1/stats/funnel?steps={quote(steps, safe=',:/*')}&{RANGE}"
                      "&format=csv", headers=world["headers"]).text


def test_stored_funnels_survive_a_restart(world, client, tally, clock, db_path):
    headers = {**world["headers"], "Content-Type": "application/json"}
    made = client.post("/api/v1/funnels", orjson.dumps(
        {"name": "Docs to paid", "steps": ["page:/docs/*", "goal:signup", "payment"]}),
        headers=headers, status=201).json["data"]
    assert made["name"] == "Docs to paid" and made["steps"] == ["page:/docs/*", "goal:signup",
                                                                "payment"]
    client.post("/api/v1/funnels", orjson.dumps({"name": "Home", "steps": "page:/,page:/pricing"}),
                headers=headers, status=201)
    bad = client.post("/api/v1/funnels", orjson.dumps({"name": "x", "steps": ["page:/"]}),
                      headers=headers, status=400).json
    assert bad["error"] == {"code": "invalid_input",
                            "message": "steps: a funnel has 2 to 8 steps, not 1"}
    client.post("/api/v1/funnels", orjson.dumps({"name": "a/b", "steps": "page:/,page:/x"}),
                headers=headers, status=400)
    by_name = world["get"](f"/api/v1/stats/funnel?funnel={quote('Docs to paid')}&{RANGE}")["data"]
    by_steps = funnel_data(world, "page:/docs/*,goal:signup,payment")
    assert by_name["funnel"] == "Docs to paid"
    assert expected_of(by_name) == expected_of(by_steps)
    listed = world["get"]("/api/v1/funnels")["data"]["funnels"]
    tally.stop(timeout=5)

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        again = webtest.TestApp(restarted)
        assert again.get("/api/v1/funnels", headers=headers).json["data"]["funnels"] == listed
        assert [f["name"] for f in listed] == ["Docs to paid", "Home"]
        assert expected_of(world["get"](
            f"/api/v1/stats/funnel?funnel={quote('Docs to paid')}&{RANGE}", app=again)["data"]
        ) == expected_of(by_steps)
        again.delete(f"/api/v1/funnels/{quote('Home')}", headers=headers, status=204)
        missing = again.delete("/api/v1/funnels/Home", headers=headers, status=404).json
        assert missing["error"]["code"] == "not_found"
        assert [f["name"] for f in again.get("/api/v1/funnels", headers=headers)
                .json["data"]["funnels"]] == ["Docs to paid"]
    finally:
        restarted.stop(timeout=5)


def test_a_version_16_database_gains_the_funnels_table(client, site, tally, clock, db_path):
    """Schema version 20 adds one table, which schema.sql makes in an older database."""
    tally.stop(timeout=5)
    execute(db_path, "DROP TABLE funnels")
    if is_postgres(db_path):
        execute(db_path, "UPDATE tally_schema_version SET version = 16")
    else:
        execute(db_path, "PRAGMA user_version = 16")
    assert cli_json("init", db=db_path)["schema_version"] == latest_version(db_path) >= 20
    again = create_app(config_for(db_path), clock=clock)
    try:
        saved = webtest.TestApp(again).post(
            "/api/v1/funnels", orjson.dumps({"name": "n", "steps": "goal:a,payment"}),
            headers={**bearer(site["key"]), "Content-Type": "application/json"}, status=201)
        assert saved.json["data"]["steps"] == ["goal:a", "payment"]
    finally:
        again.stop(timeout=5)


def test_the_readme_example(client, tally, site, clock, db_path):
    """README, Reports: Funnels, the worked example, as it reads."""
    tally.start()
    headers = {**bearer(site["key"]), "Content-Type": "application/json"}
    noon = FIRST_DAY + 12 * 3600
    visits = {  # visitor -> [(seconds after noon, name, path)]
        "A": [(0, "pageview", "/"), (20, "pageview", "/pricing"), (40, "Signup", "/app"),
              (60, "$identify", "/app")],
        "B": [(0, "Signup", "/app"), (20, "pageview", "/pricing")],
        "C": [(0, "pageview", "/pricing"), (20, "pageview", "/docs"),
              (7200, "Signup", "/app")],
        "D": [(0, "pageview", "/"), (20, "Signup", "/app")],
    }
    for n, events in enumerate(visits.values(), start=1):
        for at, name, path in events:
            clock.set(noon + at + 1)
            body = {"s": site["site"]["id"], "e": name, "u": f"https://example.com{path}",
                    "ts": (noon + at) * 1000, "ip": f"192.0.2.{n}", "ua": UA}
            if name == "$identify":
                body["uid"] = "user-a"
            client.post("/api/v1/events", orjson.dumps(body), headers=headers, status=204)
    assert tally.flusher.flush_now(timeout=WAIT)
    clock.set(noon + 3 * 3600)
    client.post("/api/v1/payments", orjson.dumps(
        {"payment_id": "pay_a", "amount": 49, "currency": "EUR", "kind": "charge",
         "paid_at": "2026-09-21T13:00:00Z", "customer": {"id": "cus_1", "user_id": "user-a"}}),
        headers=headers, status=200)
    data = client.get("/api/v1/stats/funnel?steps=page:/pricing,goal:Signup,payment"
                      "&from=2026-09-21&to=2026-09-21", headers=headers).json["data"]
    assert data["steps"] == [
        {"step": "page:/pricing", "visitors": 3, "conversion_rate": 1.0, "dropoff": 0,
         "dropoff_rate": 0.0},
        {"step": "goal:Signup", "visitors": 1, "conversion_rate": 0.3333, "dropoff": 2,
         "dropoff_rate": 0.6667},
        {"step": "payment", "visitors": 1, "conversion_rate": 0.3333, "dropoff": 0,
         "dropoff_rate": 0.0}]
    assert data["revenue"] == {"EUR": {"net": 49.0, "customers": 1}}
    # `tally report funnel` answers the same, and its CSV
    args = ("report", "funnel", "--site", site["site"]["id"], "--steps",
            "page:/pricing,goal:Signup,payment", "--from", "2026-09-21", "--to", "2026-09-21")
    assert cli_json(*args, db=db_path) == data
    csv = run_cli(*args, "--csv", db=db_path).stdout.splitlines()
    assert csv == ["step,visitors,conversion_rate,dropoff,dropoff_rate,net_EUR,customers_EUR",
                   "page:/pricing,3,1.0,0,0.0,,", "goal:Signup,1,0.3333,2,0.6667,,",
                   "payment,1,0.3333,0,0.0,49.00,1"]
    bad = run_cli("report", "funnel", "--site", site["site"]["id"], "--steps", "payment",
                  db=db_path, check=False)
    assert bad.returncode != 0 and "steps: a funnel has 2 to 8 steps, not 1" in bad.stderr
