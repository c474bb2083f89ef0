"""The benchmark's own parts: the ceiling app, its request bodies, the results it writes.

No figure is asserted here: `make bench` reports them, it never fails on them.
"""

from __future__ import annotations

import runpy
import shutil
import statistics
import subprocess

import orjson
import pytest
import webtest
from crawlerdetect import CrawlerDetect

from bench import bodies, results, run, source_cost
from bench.ceiling_app import create_app
from tests.conftest import BIN, REPO, WAIT


def test_ceiling_app_answers_post_with_204_and_no_body():
    client = webtest.TestApp(create_app())
    for path in ("/api/v1/events", "/api/v1/payments"):
        resp = client.post(path, b'{"s": "site_x"}', content_type="application/json", status=204)
        assert resp.body == b""
    assert client.get("/healthz", status=200).body == b"ok"


def test_ceiling_gunicorn_settings_are_tallys_without_its_hooks():
    ceiling = runpy.run_path(str(REPO / "bench" / "ceiling_gunicorn.conf.py"))
    tally = runpy.run_path(str(REPO / "gunicorn.conf.py"))
    assert ceiling["worker_class"] == tally["worker_class"] and ceiling["threads"] == tally["threads"]
    assert ceiling["limit_request_fields"] > 0
    assert "post_worker_init" not in ceiling and "on_starting" not in ceiling


def test_batch_bodies_hold_50_lean_events_within_8_kib():
    batches = bodies.batch_bodies("site_abcdefghijklmnop", count=50)
    for body in batches:
        assert len(body) <= 8_192
        assert len(orjson.loads(body)["b"]) == 50
    per_event = sum(map(len, batches)) / len(batches) / 50
    assert 130 <= per_event <= 163


def test_bench_events_pass_the_real_validator():
    from validation.event import parse_events

    site = "site_abcdefghijklmnop"
    singles = bodies.single_event_bodies(site, count=20)
    assert 540 <= sum(map(len, singles)) / len(singles) <= 660
    for body in [*singles, *bodies.batch_bodies(site, count=5)]:
        site_id, events = parse_events(orjson.loads(body), 1_790_000_000_000)
        assert site_id == site
        assert all(event.host in bodies.SITE_HOSTS for event in events)


@pytest.mark.parametrize("ua", bodies.USER_AGENTS + bodies.LEAN_USER_AGENTS)
def test_bench_user_agents_are_not_bots(ua):
    # A bot's events are dropped: the bench would measure nothing being stored.
    assert not CrawlerDetect().is_crawler(ua)


def _scenario(**figures):
    return {"status": "ok", **figures}


SCENARIOS = {
    "ceiling": _scenario(requests_per_s=4_000, p50_ms=1.0, p99_ms=3.0, cpu_us_per_request=100.0,
                         peak_rss_mib=[30.0, 31.0]),
    "single": _scenario(requests_per_s=3_600, events_per_s=3_600, p50_ms=1.2, p99_ms=4.0,
                        cpu_us_per_event=150.0, peak_rss_mib=[60.0], events_in_db=36_000),
    "batches": _scenario(
        steps=[],
        sustained={"offered_events_per_s": 50_000, "persisted_events_per_s": 49_000,
                   "requests_per_s": 1_000, "p50_ms": 1.0, "p99_ms": 9.0,
                   "cpu_us_per_event": 22.5, "peak_rss_mib": [70.0, 66.0]},
        at_80_percent={"offered_events_per_s": 40_000, "persisted_events_per_s": 40_000,
                       "requests_per_s": 800, "p50_ms": 0.8, "p99_ms": 12.0,
                       "cpu_us_per_event": 21.0, "peak_rss_mib": [72.0, 60.0]}),
    "payments": {"status": "skipped", "reason": "POST /api/v1/payments answered 404"},
    "sqlite": _scenario(rows_per_s=100_000, transaction_rows=5_000, indexes=["events_site_ts"]),
    "reports": {"status": "error", "reason": "RuntimeError: boom"},
}


def test_results_document_has_its_shape_and_derived_figures(tmp_path):
    doc = results.assemble({"cores": 2, "cpu_model": "Test CPU"}, {"workers": 2}, SCENARIOS,
                       date="2026-11-26T00:00:00Z")
    path = results.write_results(doc, tmp_path / "results" / "latest.json")
    back = orjson.loads(path.read_bytes())
    assert set(back) == {"schema", "date", "machine", "settings", "scenarios", "figures", "targets"}
    assert back["schema"] == results.RESULTS_SCHEMA and back["date"] == "2026-11-26T00:00:00Z"
    assert back["figures"]["single_vs_ceiling"] == 0.9
    assert back["figures"]["batch_persisted_events_per_s"] == 49_000
    assert back["figures"]["batch_vs_raw_sqlite"] == 0.49
    assert back["figures"]["batch_p99_ms_at_80"] == 12.0
    assert back["figures"]["batch_peak_rss_mib"] == 72.0
    assert back["figures"]["slowest_report_s"] is None  # an errored scenario is not measured
    verdicts = {t["name"]: t["met"] for t in back["targets"]}
    assert verdicts == {"single_vs_ceiling": True, "batch_events_per_s": False,
                        "batch_vs_raw_sqlite": False, "p99_at_80": True, "rss": False,
                        "cpu_per_event": False, "reports": None, "stats_v2_first": None,
                        "stats_v2_stored": None}
    assert not list(path.parent.glob("*.tmp"))


def test_table_shows_every_scenario_and_readme_block_is_replaced_in_place(tmp_path):
    doc = results.assemble({"cores": 2, "cpu_model": "Test CPU", "loadavg_before": [0.1]},
                       {"workers": 2}, SCENARIOS, date="2026-11-26T00:00:00Z")
    table = results.text_table(doc)
    for label in ("bare Falcon ceiling", "single events", "highest sustained", "80%",
                  "payments", "skipped: POST /api/v1/payments answered 404", "raw SQLite",
                  "error: RuntimeError: boom"):
        assert label in table
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\n## Performance\n\nintro\n\n{results.README_START}\nold\n"
                      f"{results.README_END}\n\n## Layout\nrest\n")
    assert results.update_readme(doc, readme)
    text = readme.read_text()
    assert "old" not in text and "intro" in text and text.endswith("## Layout\nrest\n")
    assert "2026-11-26 on 2 cores (Test CPU)" in text and "| 3,600 |" in text
    assert results.update_readme(doc, readme) and readme.read_text() == text


def test_make_bench_without_wrk_says_how_to_install_it_and_fails():
    proc = subprocess.run(["make", "-s", "bench", "WRK=/nonexistent/wrk"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "apt-get install wrk" in proc.stderr


def test_harness_without_wrk_stops_before_measuring(tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert run.main(["--wrk", "/nonexistent/wrk", "--out", str(out)]) == 2
    assert "apt-get install wrk" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_harness_measures_the_ceiling_and_single_events_alternated_end_to_end(tmp_path):
    out = tmp_path / "latest.json"
    proc = subprocess.run(
        [str(BIN / "python"), "-m", "bench.run", "--backend", "sqlite", "--only", "ceiling",
         "single", "--duration", "1", "--connections", "4", "--workers", "1",
         "--ceiling-rounds", "2", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=WAIT)
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(out.read_bytes())
    ceiling, single = doc["scenarios"]["ceiling"], doc["scenarios"]["single"]
    assert ceiling["status"] == "ok", ceiling
    assert ceiling["requests"] > 0 and ceiling["statuses"] == {"204": ceiling["requests"]}
    assert ceiling["worker_cpu_s"] >= 0 and len(ceiling["peak_rss_mib"]) == 1
    assert single["status"] == "ok", single
    rounds = single["rounds"]
    assert rounds["ceiling_requests_per_s"][0] == ceiling["requests_per_s"]
    assert rounds["single_requests_per_s"][0] == single["requests_per_s"]
    assert len(rounds["ceiling_requests_per_s"]) == len(rounds["single_requests_per_s"]) == 2
    assert all(rounds["ceiling_requests_per_s"]) and all(rounds["single_requests_per_s"])
    assert doc["figures"]["single_vs_ceiling"] == round(statistics.median(rounds["ratios"]), 3)
    assert "bare Falcon ceiling" in proc.stdout and "2 rounds alternated" in proc.stdout


def test_the_ratio_to_the_ceiling_is_the_median_of_the_alternated_rounds():
    rounds = {"ceiling_requests_per_s": [4_000, 8_000, 5_000],
              "single_requests_per_s": [3_600, 5_600, 3_000], "ratios": [0.9, 0.7, 0.6]}
    scenarios = {**SCENARIOS, "single": {**SCENARIOS["single"], "rounds": rounds,
                                         "ratio_to_ceiling": 0.7},
                 "collect": _scenario(requests_per_s=2_500, events_per_s=2_500, p50_ms=1.0,
                                      p99_ms=4.0, cpu_us_per_event=150.0, peak_rss_mib=[60.0])}
    doc = results.assemble({"cores": 2, "cpu_model": "Test CPU"}, {"workers": 2}, scenarios,
                           date="2026-11-27T00:00:00Z")
    assert doc["figures"]["single_vs_ceiling"] == 0.7
    assert doc["figures"]["collect_vs_ceiling"] == 0.5  # against the rounds' median ceiling
    assert {t["name"]: t["met"] for t in doc["targets"]}["single_vs_ceiling"] is False
    assert "3 rounds alternated: 0.900, 0.700, 0.600" in results.text_table(doc)


def test_slowest_report_is_the_reports_figure():
    scenarios = {"reports": _scenario(events=1_000_000, payments=3_000, reports=[
        {"name": "aggregate", "seconds": 0.4, "statuses": [200]},
        {"name": "breakdown by page", "seconds": 1.2, "statuses": [200]},
        {"name": "revenue", "seconds": 0.01, "statuses": [200]}])}
    doc = results.assemble({"cores": 2, "cpu_model": "Test CPU"}, {"workers": 2}, scenarios)
    assert doc["figures"]["slowest_report_s"] == 1.2
    assert doc["figures"]["slowest_report"] == "breakdown by page"
    assert {t["name"]: t["met"] for t in doc["targets"]}["reports"] is False
    table = results.text_table(doc)
    assert "traffic reports (aggregate, breakdowns)" in table and "(breakdown by page)" in table
    assert "money reports (revenue, mrr, movements)" in table


def test_source_cost_times_both_tables(capsys):
    assert source_cost.main(["--rounds", "1", "--runs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["referrer", "utm_source"]
    assert "(819 distinct visits)" in lines[1]


def test_collect_bodies_are_what_the_script_sends():
    from api.collect import COLLECT_FIELDS
    from enrichment.browser_ids import is_browser_id
    from validation.event import parse_events

    site = "site_abcdefghijklmnop"
    for body in bodies.collect_bodies(site, count=20):
        event = orjson.loads(body)
        assert len(body) <= 8_192 and set(event) <= COLLECT_FIELDS
        assert is_browser_id(event.pop("v"))
        assert parse_events(event, 1_790_000_000_000)[0] == site
    client = webtest.TestApp(create_app())
    assert client.post("/api/v1/collect", body, content_type="text/plain", status=204).body == b""


POSTGRES_SCENARIOS = {
    "single": _scenario(requests_per_s=1_800, events_per_s=1_800, p50_ms=2.0, p99_ms=8.0,
                        cpu_us_per_event=200.0, database_cpu_us_per_event=30.0,
                        peak_rss_mib=[70.0], events_in_db=18_000),
    "postgres": _scenario(rows=100_000, rows_per_s=90_000, transaction_rows=5_000, ways={
        "executemany": {"rows_per_s": 10_000, "client_cpu_us_per_row": 25.0,
                        "server_cpu_us_per_row": 60.0},
        "COPY": {"rows_per_s": 90_000, "client_cpu_us_per_row": 3.0,
                 "server_cpu_us_per_row": None}}),
    "payments": {"status": "error", "reason": "RuntimeError: pg boom"},
    "hosts": _scenario(events_per_host=100_000, events_per_s=52_000, two_over_one=1.3,
                       one_host={"hosts": 1, "events": 100_000, "events_per_s": 40_000},
                       two_hosts={"hosts": 2, "events": 200_000, "events_per_s": 52_000}),
}


def test_postgres_figures_sit_next_to_sqlites_with_their_ratio():
    doc = results.assemble({"cores": 2, "cpu_model": "Test CPU", "postgresql": "PostgreSQL 15.9"},
                           {"workers": 2}, SCENARIOS, postgres=POSTGRES_SCENARIOS,
                           date="2026-11-26T00:00:00Z")
    postgres = doc["postgres"]
    assert postgres["backend"] == "postgres" and postgres["scenarios"] == POSTGRES_SCENARIOS
    assert postgres["figures"]["single_vs_ceiling"] is None  # no ceiling of its own
    side = {row["figure"]: row for row in postgres["vs_sqlite"]}
    assert side["single events, req/s"] == {"figure": "single events, req/s", "sqlite": 3_600,
                                            "postgres": 1_800, "postgres_vs_sqlite": 0.5}
    raw = side["raw events insert, rows/s (SQLite executemany, PostgreSQL COPY)"]
    assert (raw["sqlite"], raw["postgres"], raw["postgres_vs_sqlite"]) == (100_000, 90_000, 0.9)
    assert side["payments upserts, req/s"]["postgres"] is None
    text = results.markdown(doc)
    assert "PostgreSQL 15.9 on the same machine" in text
    assert "| single events, req/s | 3,600 | 1,800 | 0.50 |" in text
    assert "payments: error (RuntimeError: pg boom)" in text
    assert "COPY 90,000 rows/s, 3.0 us/row CPU in Python." in text
    assert side["two hosts over one host's flush thread"]["postgres"] == 1.3
    assert side["flush threads of two hosts at once, events/s"]["sqlite"] is None
    assert "stored 52,000 events/s against one host's 40,000 (1.30 x;" in text
    table = results.text_table(doc)
    assert "raw PostgreSQL insert, events schema" in table and "executemany 10,000/s" in table
    assert "one host alone 40,000/s; two over one 1.30" in table
    assert "PostgreSQL next to SQLite" in table
    without = results.assemble({"cores": 2, "cpu_model": "T"}, {"workers": 2}, SCENARIOS)
    assert "postgres" not in without and "PostgreSQL" not in results.markdown(without)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_an_unreachable_postgresql_is_recorded_as_skipped(tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert run.main(["--backend", "postgres", "--only", "single", "flusher", "--out", str(out),
                     "--postgres-url", "postgresql://bench:secret@127.0.0.1:1/none"]) == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["scenarios"] == {} and doc["settings"]["backends"] == ["postgres"]
    skipped = doc["postgres"]["scenarios"]
    assert set(skipped) == {"single", "flusher"}
    assert all(r["status"] == "skipped" and "no PostgreSQL at" in r["reason"]
               for r in skipped.values())
    assert "secret" not in out.read_text() and "secret" not in capsys.readouterr().err


@pytest.mark.parametrize("quick", [False, True])
def test_make_bench_hands_the_reads_bench_every_option_its_own_command_line_has(
        quick, monkeypatch, tmp_path):
    from bench import reads

    handed = {}
    monkeypatch.setattr(reads, "run_backend", lambda backend, options, folder, log:
                        handed.update(vars(options)) or {})
    bench = run.Bench(workers=2, load=run.Load(threads=1, connections=4, duration=7),
                      folder=tmp_path, quick=quick)
    bench.reads()
    assert handed.keys() == vars(reads.parse_options([])).keys()
    assert handed["duration"] == 7 and handed["workers"] == 2
    assert handed["unbounded"] is not quick


def test_the_reads_bench_puts_the_postgresql_server_in_a_cpu_group_and_back():
    import psycopg

    from bench.measure import (
        CpuWeightUnavailable,
        _cpu_cgroup_root,
        _cpu_group_of,
        _postmaster_pid,
        postgres_cpu_weight,
    )
    from tests.realparts import POSTGRES_URL

    try:
        weight_file = _cpu_cgroup_root()[1]

        def cpu_group(pid: int) -> str:
            return _cpu_group_of(pid, weight_file)

        postmaster = _postmaster_pid(POSTGRES_URL)
        where = cpu_group(postmaster)
        # Weight 100 is everyone's: the suite's other tests on the server are not slowed.
        with postgres_cpu_weight(POSTGRES_URL, 100, wait=WAIT) as group, \
                psycopg.connect(POSTGRES_URL) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            assert cpu_group(backend).endswith(group.name)  # started inside: it is inside
            assert cpu_group(postmaster).endswith(group.name)
    except CpuWeightUnavailable as exc:  # bench tooling, not a part of Tally
        pytest.skip(f"SKIPPED LOUDLY: no CPU group for the PostgreSQL server here: {exc}")
    assert not group.exists() and cpu_group(postmaster) == where


def test_the_ceilings_requests_carry_an_authorization_header_of_tallys_shape():
    # Tally's single events carry one; the ceiling's requests must cost gunicorn the same.
    from bench.run import CEILING_KEY
    from storage.directory import KEY_PATTERN

    assert KEY_PATTERN.fullmatch(CEILING_KEY)
