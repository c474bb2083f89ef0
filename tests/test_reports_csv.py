"""CSV answers (breakdown, revenue, timeseries) and the `tally report` options, compared
with the JSON of the same request; formula injection neutralised."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest

from reports.shared.csv_text import cell, write
from tests.conftest import bearer, run_cli
from tests.test_reports_http import FIREFOX, api  # noqa: F401 - the fixture
from tests.test_reports_revenue_by import shop  # noqa: F401 - the fixture

EVIL = {"ip": "81.2.69.170", "ua": FIREFOX}
RANGE = "from=2026-09-01&to=2026-09-21"


def test_cells_by_hand():
    assert [cell(v) for v in ("=1+2", "+1", "-x", "@SUM(A1)", "\tx", "plain", None,
                              Decimal("-20.00"), -3, 0.25)] == [
        "'=1+2", "'+1", "'-x", "'@SUM(A1)", "'\tx", "plain", "", "-20.00", "-3", "0.25"]
    text = write(["a", "b"], [['say "hi", then', "line\nbreak"], ["=cmd", Decimal("1.50")]])
    assert text == 'a,b\r\n"say ""hi"", then","line\nbreak"\r\n\'=cmd,1.50\r\n'


def test_cells_are_judged_after_what_a_spreadsheet_skips_or_folds():
    # The three (a NUL, a byte-order mark, a full-width sign) and their kin.
    hidden = ["\x00=6+6", "\ufeff=7+7", "\uff1d4+4", "\uff0b1", "\uff0d1", "\uff20x",
              " =1", "\u200b\u00a0@SUM(A1)", "\x01\x1f+1", "\ufe62x", "=\u0338"]
    assert [cell(v) for v in hidden] == ["'" + v for v in hidden]
    # Ordinary values are written exactly as they are.
    plain = ["caf\u00e9", "\u65e5\u672c", "Paid Search", "2026-09-21", "a=b", "x-1", "",
             " spaced", "\ufeffplain", "\uff21BC", "\u2212 5"]
    assert [cell(v) for v in plain] == plain


def test_a_full_width_formula_from_a_visit_is_neutralised(shop):  # noqa: F811
    shop.events(shop.event(EVIL, "pageview", "/?utm_source=%EF%BC%9D4%2B4%2Bcmd", 2500))
    lines = parse(shop.get(f"/api/v1/stats/breakdown?by=source&{RANGE}&format=csv").body)
    assert ["'\uff1d4+4+cmd", "1", "1", "0"] in lines


def parse(body: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(body.decode("utf-8"), newline="")))


@pytest.fixture
def evil(shop):  # noqa: F811
    """A visitor whose campaign and source look like spreadsheet formulas."""
    shop.events(shop.event(EVIL, "pageview", "/?utm_source=%3DHYPERLINK(1)&utm_campaign=%2B1-2",
                           2500))
    return shop


def test_breakdown_csv_has_the_json_rows_and_no_live_formula(evil):
    data = evil.data(f"/api/v1/stats/breakdown?by=source&{RANGE}")
    resp = evil.get(f"/api/v1/stats/breakdown?by=source&{RANGE}&format=csv")
    assert resp.content_type == "text/csv"
    assert resp.headers["Content-Disposition"] == 'attachment; filename="breakdown.csv"'
    lines = parse(resp.body)
    assert lines[0] == ["value", "visitors", "pageviews", "events"]
    expected = [["'" + r["value"] if r["value"] and r["value"][0] in "=+-@" else r["value"] or "",
                 str(r["visitors"]), str(r["pageviews"]), str(r["events"])] for r in data["rows"]]
    assert lines[1:] == expected
    assert ["'=HYPERLINK(1)", "1", "1", "0"] in lines
    # The same through the Accept header; format=json wins over it.
    accept = evil.get_with(f"/api/v1/stats/breakdown?by=source&{RANGE}", {"Accept": "text/csv"})
    assert accept.body == resp.body
    forced = evil.get_with(f"/api/v1/stats/breakdown?by=source&{RANGE}&format=json",
                           {"Accept": "text/csv"})
    assert forced.json["data"]["rows"] == json.loads(json.dumps(data["rows"], default=str))


def test_revenue_csv_lists_each_currency_and_value(evil):
    data = evil.data(f"/api/v1/stats/revenue?by=campaign&{RANGE}")
    lines = parse(evil.get(f"/api/v1/stats/revenue?by=campaign&{RANGE}&format=csv").body)
    assert lines[0] == ["currency", "campaign", "gross", "refunds", "chargebacks", "fees", "net",
                        "net_after_fees", "payments", "customers", "visitors",
                        "paying_customers", "conversion_rate", "net_per_visitor"]
    assert len(lines) == 1 + sum(len(f["rows"]) for f in data["currencies"].values())
    assert ["EUR", "", "100.00", "20.00", "0.00", "0.00", "80.00", "80.00", "2", "1", "3", "1",
            "0.3333", "26.67"] in lines
    assert ["EUR", "Unattributed", "25.00", "0.00", "0.00", "0.00", "25.00", "25.00", "1", "1",
            "", "", "", ""] in lines


def test_timeseries_csv_has_a_column_per_currency_figure(evil):
    query = "from=2026-09-19&to=2026-09-21"
    data = evil.data(f"/api/v1/stats/timeseries?{query}&goal=signup")
    lines = parse(evil.get(f"/api/v1/stats/timeseries?{query}&goal=signup&format=csv").body)
    assert lines[0] == ["start", "visitors", "pageviews", "sessions", "events", "bounce_rate",
                        "avg_session_seconds", "conversions", "conversion_rate", "goal_events",
                        "net_EUR", "new_customers_EUR", "mrr_EUR"]
    assert [line[0] for line in lines[1:]] == ["2026-09-19", "2026-09-20", "2026-09-21"]
    today = data["rows"][2]
    assert lines[3] == [today["start"], *(str(today[k]) for k in (
        "visitors", "pageviews", "sessions", "events", "bounce_rate", "avg_session_seconds",
        "conversions", "conversion_rate", "goal_events")), "-20.00", "0", "100.00"]


def test_format_is_checked(evil):
    body = evil.get("/api/v1/stats/breakdown?by=page&format=xml", status=400).json
    assert body["error"]["message"] == "format: must be json or csv"
    body = evil.get("/api/v1/stats/mrr?format=csv", status=400).json
    assert body["error"]["message"] == "unknown parameter 'format'; this report takes at, filters"
    # A report without CSV answers JSON whatever the Accept header says.
    assert evil.get_with("/api/v1/stats/aggregate", {"Accept": "text/csv"}).json["ok"]


def cli(*args, db):
    return json.loads(run_cli("report", *args, "--json", db=db).stdout, parse_float=Decimal)


def test_tally_report_takes_the_same_options(evil, db_path):
    site = ["--site", evil.site_id]
    assert cli("timeseries", *site, "--from", "2026-09-19", "--to", "2026-09-21",
               "--filters", "source==Google", "--goal", "signup", "--compare", "previous_period",
               db=db_path) == evil.data(
        "/api/v1/stats/timeseries?from=2026-09-19&to=2026-09-21&filters=source==Google"
        "&goal=signup&compare=previous_period")
    assert cli("revenue", *site, "--from", "2026-09-01", "--to", "2026-09-21", "--by", "source",
               "--filters", "channel!=Direct", db=db_path) == evil.data(
        "/api/v1/stats/revenue?from=2026-09-01&to=2026-09-21&by=source&filters=channel!=Direct")
    assert cli("goals", *site, "--from", "2026-09-21", "--to", "2026-09-21", db=db_path) == \
        evil.data("/api/v1/stats/goals?from=2026-09-21&to=2026-09-21")
    traffic = cli("traffic", *site, "--from", "2026-09-21", "--to", "2026-09-21", "--by", "page",
                  "--filters", "device==mobile", "--goal", "signup", db=db_path)
    assert traffic["breakdown"] == evil.data("/api/v1/stats/breakdown?by=page&from=2026-09-21"
                                             "&to=2026-09-21&filters=device==mobile&goal=signup")
    text = run_cli("report", "timeseries", *site, "--from", "2026-09-19", "--to", "2026-09-21",
                   "--csv", db=db_path).stdout
    http = evil.get("/api/v1/stats/timeseries?from=2026-09-19&to=2026-09-21&format=csv").body
    assert text == http.decode().replace("\r\n", "\n")
    realtime = cli("realtime", *site, db=db_path)
    assert len(realtime["pageviews_per_minute"]) == 30 and realtime["max_delay_seconds"] == 1
    bad = run_cli("report", "timeseries", *site, "--filters", "planet==Mars", db=db_path,
                  check=False)
    assert bad.returncode == 1 and "filters: unknown dimension 'planet'" in bad.stderr
    human = run_cli("report", "goals", *site, "--from", "2026-09-01", "--to", "2026-09-21",
                    db=db_path).stdout
    assert "signup" in human and "EUR 50.00" in human


@pytest.fixture(autouse=True)
def _get_with(api, client, site):  # noqa: F811
    def get_with(path, headers):
        return client.get(path, headers={**bearer(site["key"]), **headers})
    api.get_with = get_with
