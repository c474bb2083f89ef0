"""The results of a run: derived figures, targets, the JSON file, the tables.

The document's top-level scenarios, figures and targets are SQLite's, the default backend;
a run that measured PostgreSQL too adds `postgres`: the same three for it (backend
"postgres") and `vs_sqlite`, the headline figures of both side by side with their ratio.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "latest.json"
README = REPO / "README.md"
README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
RESULTS_SCHEMA = 1

TARGETS = (
    # (name, target text, figure key, comparison, threshold)
    ("single_vs_ceiling", "single events >= 90% of the bare-Falcon ceiling",
     "single_vs_ceiling", ">=", 0.90),
    ("batch_events_per_s", "batches >= 60,000 events/s persisted, zero 503",
     "batch_persisted_events_per_s", ">=", 60_000),
    ("batch_vs_raw_sqlite", "batches >= 60% of the raw SQLite insert rate",
     "batch_vs_raw_sqlite", ">=", 0.60),
    ("p99_at_80", "p99 <= 15 ms at 80% of the sustained batch rate", "batch_p99_ms_at_80", "<=", 15),
    ("rss", "worker RSS <= 64 MiB under batch load", "batch_peak_rss_mib", "<=", 64),
    ("cpu_per_event", "CPU per event in batches <= 20 us", "batch_cpu_us_per_event", "<=", 20),
    ("reports", "each report over 1,000,000 events < 1 s", "slowest_report_s", "<", 1.0),
    ("stats_v2_first", "each Stats v2 report < 1 s the first time", "stats_v2_first_s", "<", 1.0),
    ("stats_v2_stored", "each Stats v2 report < 100 ms once final days are stored",
     "stats_v2_stored_s", "<", 0.1),
)


def _ok(result: dict | None) -> dict | None:
    return result if result and result.get("status") == "ok" else None


def derived_figures(scenarios: dict) -> dict:
    """Ratios and the headline figures the targets compare, None where not measured."""
    ceiling, single = _ok(scenarios.get("ceiling")), _ok(scenarios.get("single"))
    batches, raw = _ok(scenarios.get("batches")), _ok(scenarios.get("sqlite"))
    reports = _ok(scenarios.get("reports"))
    sustained = (batches or {}).get("sustained") or {}
    at_80 = (batches or {}).get("at_80_percent") or {}
    figures: dict = {
        "single_vs_ceiling": None, "batch_persisted_events_per_s": None,
        "batch_vs_raw_sqlite": None, "batch_p99_ms_at_80": at_80.get("p99_ms"),
        "batch_peak_rss_mib": None, "batch_cpu_us_per_event": sustained.get("cpu_us_per_event"),
        "slowest_report_s": None, "slowest_report": None,
        "stats_v2_first_s": None, "stats_v2_stored_s": None,
    }
    if ceiling and single and single.get("ratio_to_ceiling") is not None:
        figures["single_vs_ceiling"] = round(single["ratio_to_ceiling"], 3)
    elif ceiling and single and ceiling.get("requests_per_s"):
        figures["single_vs_ceiling"] = round(single["requests_per_s"] / ceiling["requests_per_s"], 3)
    collect = _ok(scenarios.get("collect"))
    figures["collect_vs_ceiling"] = None
    if ceiling and collect and ceiling.get("requests_per_s"):
        ceilings = ((single or {}).get("rounds") or {}).get("ceiling_requests_per_s") \
            or [ceiling["requests_per_s"]]
        figures["collect_vs_ceiling"] = round(
            collect["requests_per_s"] / statistics.median(ceilings), 3)
    if sustained:
        figures["batch_persisted_events_per_s"] = sustained.get("persisted_events_per_s")
        rss = [*sustained.get("peak_rss_mib", []), *at_80.get("peak_rss_mib", [])]
        figures["batch_peak_rss_mib"] = max(rss) if rss else None
        if raw and raw.get("rows_per_s"):
            figures["batch_vs_raw_sqlite"] = round(
                sustained["persisted_events_per_s"] / raw["rows_per_s"], 3)
    raw_postgres = _ok(scenarios.get("postgres"))
    if sustained and raw_postgres and raw_postgres.get("rows_per_s"):
        figures["batch_vs_raw_postgres"] = round(
            sustained["persisted_events_per_s"] / raw_postgres["rows_per_s"], 3)
    if reports and reports.get("reports"):
        figures["slowest_report_s"] = max(r["seconds"] for r in reports["reports"])
        figures["slowest_report"] = max(reports["reports"], key=lambda r: r["seconds"])["name"]
    v2 = (reports or {}).get("stats_v2") or []
    if v2:
        figures["stats_v2_first_s"] = max(r["runs_s"][0] for r in v2)
        figures["stats_v2_stored_s"] = max(min(r["runs_s"][1:] or r["runs_s"]) for r in v2)
    return figures


def targets(figures: dict) -> list[dict]:
    out = []
    for name, text, key, comparison, threshold in TARGETS:
        value = figures.get(key)
        met = None
        if value is not None:
            met = value >= threshold if comparison == ">=" else (
                value <= threshold if comparison == "<=" else value < threshold)
        out.append({"name": name, "target": text, "figure": value, "met": met})
    return out


def assemble(machine: dict, settings: dict, scenarios: dict, *, postgres: dict | None = None,
             date: str | None = None) -> dict:
    """`scenarios`: SQLite's; `postgres`: PostgreSQL's, when it was measured."""
    figures = derived_figures(scenarios)
    doc = {
        "schema": RESULTS_SCHEMA,
        "date": date or dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "machine": machine,
        "settings": settings,
        "scenarios": scenarios,
        "figures": figures,
        "targets": targets(figures),
    }
    if postgres is not None:
        postgres_figures = derived_figures(postgres)
        doc["postgres"] = {"backend": "postgres", "scenarios": postgres,
                           "figures": postgres_figures, "targets": targets(postgres_figures),
                           "vs_sqlite": side_by_side(scenarios, postgres)}
    return doc


def _report_groups(reports: dict) -> list[tuple[str, list[dict]]]:
    money = {"revenue", "mrr", "movements"}
    return [("traffic reports (aggregate, breakdowns)",
             [r for r in reports["reports"] if r["name"] not in money]),
            ("money reports (revenue, mrr, movements)",
             [r for r in reports["reports"] if r["name"] in money])]


def _dig(result: dict | None, *keys):
    for key in keys:
        if not isinstance(result, dict):
            return None
        result = result.get(key)
    return result


def _answered(found: list[dict]) -> list[dict]:
    return [r for r in found if r["statuses"] == [200]]


def _slowest_ms(reports: dict | None, group: int) -> float | None:
    """Of the reports that answered 200 (a failure's time says nothing of the report's)."""
    if not reports or not reports.get("reports"):
        return None
    found = _answered(_report_groups(reports)[group][1])
    return round(max(r["seconds"] for r in found) * 1000, 1) if found else None


def _stats_v2_stored_ms(reports: dict | None) -> float | None:
    v2 = _answered((reports or {}).get("stats_v2") or [])
    return round(max(min(r["runs_s"][1:] or r["runs_s"]) for r in v2) * 1000, 1) if v2 else None


def _failed_reports(reports: dict | None) -> int | None:
    if not reports or not reports.get("reports"):
        return None
    every = [*reports["reports"], *(reports.get("stats_v2") or [])]
    return len(every) - len(_answered(every))


# The figures shown for both backends: (label, figure of a backend's scenarios). Database
# CPU is the PostgreSQL server's share, in its own processes (SQLite's is in the workers').
HEADLINES = (
    ("single events, req/s", lambda s: _dig(_ok(s.get("single")), "requests_per_s")),
    ("single events, p99 ms", lambda s: _dig(_ok(s.get("single")), "p99_ms")),
    ("50-event batches, highest sustained events/s persisted",
     lambda s: _dig(_ok(s.get("batches")), "sustained", "persisted_events_per_s")),
    ("50-event batches, workers' CPU us/event",
     lambda s: _dig(_ok(s.get("batches")), "sustained", "cpu_us_per_event")),
    ("50-event batches, database server's CPU us/event",
     lambda s: _dig(_ok(s.get("batches")), "sustained", "database_cpu_us_per_event")),
    ("50-event batches at 80% of it, p99 ms",
     lambda s: _dig(_ok(s.get("batches")), "at_80_percent", "p99_ms")),
    ("payments upserts, req/s", lambda s: _dig(_ok(s.get("payments")), "requests_per_s")),
    ("payments upserts, p99 ms", lambda s: _dig(_ok(s.get("payments")), "p99_ms")),
    ("raw events insert, rows/s (SQLite executemany, PostgreSQL COPY)",
     lambda s: _dig(_ok(s.get("sqlite")) or _ok(s.get("postgres")), "rows_per_s")),
    ("flush thread alone, events/s", lambda s: _dig(_ok(s.get("flusher")), "events_per_s")),
    ("flush thread alone, its CPU us/event",
     lambda s: _dig(_ok(s.get("flusher")), "cpu_us_per_event")),
    ("flush thread alone, database server's CPU us/event",
     lambda s: _dig(_ok(s.get("flusher")), "database_cpu_us_per_event")),
    ("flush threads of two hosts at once, events/s",
     lambda s: _dig(_ok(s.get("hosts")), "two_hosts", "events_per_s")),
    ("two hosts over one host's flush thread",
     lambda s: _dig(_ok(s.get("hosts")), "two_over_one")),
    ("events table bytes an event, with its index",
     lambda s: _dig(_ok(s.get("flusher")), "bytes_per_event")),
    ("events the reports ran over", lambda s: _dig(_ok(s.get("reports")), "events")),
    ("slowest traffic report, ms", lambda s: _slowest_ms(_ok(s.get("reports")), 0)),
    ("slowest money report, ms", lambda s: _slowest_ms(_ok(s.get("reports")), 1)),
    ("slowest Stats v2 report once stored, ms",
     lambda s: _stats_v2_stored_ms(_ok(s.get("reports")))),
    ("reports not answered 200 (left out of the times)",
     lambda s: _failed_reports(_ok(s.get("reports")))),
)


def side_by_side(sqlite: dict, postgres: dict) -> list[dict]:
    """Each headline figure on both backends, and PostgreSQL's over SQLite's."""
    rows = []
    for label, figure in HEADLINES:
        a, b = figure(sqlite), figure(postgres)
        ratio = round(b / a, 2) if a and b is not None else None
        rows.append({"figure": label, "sqlite": a, "postgres": b, "postgres_vs_sqlite": ratio})
    return rows


def write_results(doc: dict, path: Path = RESULTS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    tmp.replace(path)
    return path


def _fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    if isinstance(value, (int, float)):
        return f"{round(value):,}"
    return str(value)


def table_rows(doc: dict) -> list[list[str]]:
    """Scenario, req/s, events/s, p50 ms, p99 ms, CPU us/event, peak RSS MiB, note."""
    s = doc["scenarios"]
    rows = []

    def add(name, r, events_key="events_per_s", note=""):
        if r is None:
            return
        if r.get("status") != "ok":
            rows.append([name, "-", "-", "-", "-", "-", "-", f"{r.get('status')}: {r.get('reason', '')}"[:90]])
            return
        cpu = r.get("cpu_us_per_event", r.get("cpu_us_per_request"))
        rss = max(r["peak_rss_mib"]) if r.get("peak_rss_mib") else None
        rows.append([name, _fmt(r.get("requests_per_s")), _fmt(r.get(events_key)),
                     _fmt(r.get("p50_ms"), 2), _fmt(r.get("p99_ms"), 2), _fmt(cpu, 1),
                     _fmt(rss, 1), note])

    ceiling = s.get("ceiling")
    add("bare Falcon ceiling (POST 204)", ceiling, note="CPU per request")
    single = s.get("single")
    rounds = (single or {}).get("rounds") or {}
    add("single events (~600 B, closed loop)", single, "events_per_s",
        (f"{_fmt((single or {}).get('events_in_db'))} in db" if _ok(single) else "")
        + (f"; to the ceiling, {len(rounds['ratios'])} rounds alternated: "
           + ", ".join(_fmt(r, 3) for r in rounds["ratios"]) if rounds.get("ratios") else ""))
    collect = s.get("collect")
    add("collect (tally.js, no key, closed loop)", collect, "events_per_s",
        f"{_fmt((collect or {}).get('events_in_db'))} in db" if _ok(collect) else "")
    batches = s.get("batches")
    if _ok(batches) and batches.get("sustained"):
        sus = {**batches["sustained"], "status": "ok"}
        add("50-event batches, highest sustained", sus, "persisted_events_per_s",
            f"offered {_fmt(sus['offered_events_per_s'])}/s, 0 x 503, persisted/s shown")
        at80 = {**batches["at_80_percent"], "status": "ok"}
        add("50-event batches at 80% of it", at80, "persisted_events_per_s",
            f"offered {_fmt(at80['offered_events_per_s'])}/s")
    elif batches is not None:
        add("50-event batches", batches if batches.get("status") != "ok"
            else {"status": "none sustained", "reason": "503 at the lowest rate"})
    payments = s.get("payments")
    add("payments upserts (closed loop)", payments, note="CPU per request" if _ok(payments) else "")
    raw = s.get("sqlite")
    if _ok(raw):
        rows.append(["raw SQLite insert, events schema", "-", _fmt(raw["rows_per_s"]), "-", "-",
                     "-", "-", f"{raw['transaction_rows']:,}-row transactions, {len(raw['indexes'])} index(es)"])
    elif raw is not None:
        add("raw SQLite insert, events schema", raw)
    flush = s.get("flusher")
    if _ok(flush):
        enrich = flush.get("enrich_only") or {}
        rows.append([f"flush thread alone, {flush['events']:,} events", "-",
                     _fmt(flush["events_per_s"]), "-", "-", _fmt(flush["cpu_us_per_event"], 1),
                     "-", f"{flush['seconds']} s; enrichment alone "
                     f"{_fmt(enrich.get('cpu_us_per_event'), 1)} us/event"])
    elif flush is not None:
        add("flusher alone", flush)
    hosts = s.get("hosts")
    if _ok(hosts):
        one, two = hosts["one_host"], hosts["two_hosts"]
        rows.append([f"flush threads of 2 hosts, {hosts['events_per_host']:,} events each", "-",
                     _fmt(two["events_per_s"]), "-", "-", "-", "-",
                     f"one host alone {_fmt(one['events_per_s'])}/s; two over one "
                     f"{_fmt(hosts['two_over_one'], 2)}"])
    elif hosts is not None:
        add("flush threads of 2 hosts", hosts)
    raw_postgres = s.get("postgres")
    if _ok(raw_postgres):
        ways = raw_postgres["ways"]
        rows.append(["raw PostgreSQL insert, events schema", "-", _fmt(raw_postgres["rows_per_s"]),
                     "-", "-", "-", "-",
                     f"COPY; {raw_postgres['transaction_rows']:,}-row transactions; "
                     + ", ".join(f"{way} {_fmt(w['rows_per_s'])}/s" for way, w in ways.items()
                                 if way != "COPY")])
    elif raw_postgres is not None:
        add("raw PostgreSQL insert, events schema", raw_postgres)
    reports = s.get("reports")
    if _ok(reports):
        for label, group in _report_groups(reports):
            if not group:
                continue
            slowest = max(group, key=lambda r: r["seconds"])
            failed = sorted({s for r in group for s in r["statuses"] if s != 200})
            rows.append([label, "-", "-", _fmt(slowest["seconds"] * 1000, 1), "-", "-", "-",
                         f"slowest of {len(group)} ({slowest['name']}), median of 3 GETs; "
                         f"{reports['events']:,} events, {reports['payments']:,} payments"
                         + (f"; answered {failed}" if failed else "")])
        v2 = reports.get("stats_v2") or []
        if v2:
            first = max(v2, key=lambda r: r["runs_s"][0])
            stored = max(v2, key=lambda r: min(r["runs_s"][1:] or r["runs_s"]))
            rows.append(["Stats v2 reports", "-", "-",
                         _fmt(min(stored["runs_s"][1:] or stored["runs_s"]) * 1000, 1), "-",
                         "-", "-",
                         f"slowest of {len(v2)} once stored ({stored['name']}); first time "
                         f"slowest {first['runs_s'][0]} s ({first['name']})"])
    elif reports is not None:
        add("reports", reports)
    slow = s.get("slow_clients")
    if _ok(slow):
        rows.append([f"/healthz, {slow['idle_connections']} idle + {slow['slow_bodies']} slow-body"
                     " clients held", "-", "-", _fmt(slow["median_ms"], 1), "-", "-", "-",
                     f"{slow['answered_200']}/{slow['probes']} answered 200, slowest "
                     f"{_fmt(slow['max_ms'], 1)} ms"])
    elif slow is not None:
        add("slow clients", slow)
    reads = s.get("reads")
    if _ok(reads):
        alone = [run for worst in reads.get("worst", []) for run in worst["runs"]]
        if alone:
            most = max(alone, key=lambda r: r["server_cpu_s"] + r.get("database_cpu_s", 0))
            rows.append(["worst read within the limits, alone", "-", "-",
                         _fmt(most["wall_s"] * 1000, 1), "-", "-", "-",
                         f"at most {most['server_cpu_s']} s worker CPU"
                         + (f" + {most['database_cpu_s']} s database" if "database_cpu_s"
                            in most else "")
                         + f", answered {most['status']}; budget {reads['budget_s']} s; "
                         f"{reads['data']['events']:,} events"])
        ingest = reads.get("ingest") or {}
        if ingest:
            rows.append(["events p99 quiet / with 10 worst reads", "-", "-",
                         _fmt(ingest["quiet_p50_ms_median"], 1),
                         _fmt(ingest["with_10_worst_reads_p99_ms_median"], 1), "-", "-",
                         f"quiet p99 {_fmt(ingest['quiet_p99_ms_median'], 1)} ms; ratio "
                         f"{ingest['p99_ratio_of_medians']} (medians of "
                         f"{len(ingest['rounds'])} rounds at {_fmt(ingest['rate_rps'])} req/s)"])
    elif reads is not None:
        add("read abuse", reads)
    hostile = s.get("hostile")
    if _ok(hostile):
        for case in hostile["cases"]:
            rows.append([case["name"], "-", "-", "-", "-", "-", "-",
                         f"{_fmt(case['ms_per_call'], 3)} ms CPU per call,"
                         f" {_fmt(case['ms_per_request'], 2)} ms per request"
                         f" ({case['calls_per_request']} calls)"
                         + (f"; {case['note']}" if case["note"] else "")])
    elif hostile is not None:
        add("hostile inputs", hostile)
    return rows


HEADER = ["scenario", "req/s", "events/s", "p50 ms", "p99 ms", "CPU us/event", "RSS MiB", "note"]


def text_table(doc: dict) -> str:
    rows = [HEADER, *table_rows(doc)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
             for r in rows]
    lines += ["", "ratios: single/ceiling "
              f"{_fmt(doc['figures']['single_vs_ceiling'], 3)}, collect/ceiling "
              f"{_fmt(doc['figures'].get('collect_vs_ceiling'), 3)}, batch persisted/raw SQLite "
              f"{_fmt(doc['figures']['batch_vs_raw_sqlite'], 3)}", "targets:"]
    for t in doc["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        lines.append(f"  {t['target']}: {_fmt(t['figure'], 3) if isinstance(t['figure'], float) else _fmt(t['figure'])} ({verdict})")
    postgres = doc.get("postgres")
    if postgres:
        rows = [HEADER, *table_rows(postgres)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
        lines += ["", f"PostgreSQL ({doc['machine'].get('postgresql', '')}):"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
                  for r in rows]
        lines += ["", "PostgreSQL next to SQLite:"]
        width = max(len(row["figure"]) for row in postgres["vs_sqlite"])
        for row in postgres["vs_sqlite"]:
            lines.append(f"  {row['figure'].ljust(width)}  {_fmt(row['sqlite'], 2):>10}"
                         f"  {_fmt(row['postgres'], 2):>10}  x{_fmt(row['postgres_vs_sqlite'], 2)}")
    return "\n".join(lines)


def _figure(value) -> str:
    return _fmt(value, 1) if isinstance(value, float) and value < 100 else _fmt(value)


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [f"Measured {doc['date'][:10]} on {m['cores']} cores ({m['cpu_model']}), "
             f"{doc['settings']['workers']} threaded workers (gunicorn.conf.py), wrk on the same"
             " cores, load average "
             f"before the run {', '.join(map(str, m.get('loadavg_before', [])))}. "
             f"Raw figures: `bench/results/latest.json`.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(doc)]
    lines += ["", "| target | figure | met |", "|---|---|---|"]
    for t in doc["targets"]:
        verdict = {True: "yes", False: "no", None: "not measured"}[t["met"]]
        figure = _fmt(t["figure"], 3) if isinstance(t["figure"], float) else _fmt(t["figure"])
        lines.append(f"| {t['target']} | {figure} | {verdict} |")
    postgres = doc.get("postgres")
    if postgres:
        lines += ["", f"{m.get('postgresql', 'PostgreSQL')} on the same machine and the same "
                  "scenarios (`--backend postgres`; the server's CPU read from its processes):",
                  "", "| figure | SQLite | PostgreSQL | PostgreSQL / SQLite |", "|---|---|---|---|"]
        for row in postgres["vs_sqlite"]:
            if row["sqlite"] is None and row["postgres"] is None:
                continue
            lines.append(f"| {row['figure']} | {_figure(row['sqlite'])} | "
                         f"{_figure(row['postgres'])} | {_fmt(row['postgres_vs_sqlite'], 2)} |")
        failed = [f"{name}: {r.get('status')} ({r.get('reason', '')[:120]})"
                  for name, r in postgres["scenarios"].items() if r.get("status") != "ok"]
        if failed:
            lines += ["", "Not measured on PostgreSQL: " + "; ".join(failed) + "."]
        raw = _ok(postgres["scenarios"].get("postgres"))
        if raw:
            lines += ["", f"The events write on PostgreSQL, {raw['transaction_rows']:,}-row "
                      "transactions of enriched events (`bench/postgres_insert.py`): "
                      + "; ".join(f"{way} {_fmt(w['rows_per_s'])} rows/s, "
                                  f"{_fmt(w['client_cpu_us_per_row'], 1)} us/row CPU in Python"
                                  + (f" + {_fmt(w['server_cpu_us_per_row'], 1)} in the server"
                                     if w.get("server_cpu_us_per_row") is not None else "")
                                  for way, w in raw["ways"].items())
                      + ". Storage writes events and sessions with COPY."]
        hosts = _ok(postgres["scenarios"].get("hosts"))
        if hosts:
            one, two = hosts["one_host"], hosts["two_hosts"]
            lines += ["", f"Two hosts at once (`bench/parallel_flush.py`: each a process with its"
                      f" own site, {hosts['events_per_host']:,} events each, flush threads alone"
                      f" into the one server) stored {_fmt(two['events_per_s'])} events/s against"
                      f" one host's {_fmt(one['events_per_s'])} ({_fmt(hosts['two_over_one'], 2)}"
                      " x; issue 29: two hosts not slower than one)."]
    return "\n".join(lines)


def update_readme(doc: dict, path: Path = README) -> bool:
    """Replace the block between the bench markers of README's Performance section."""
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        return False
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(f"{head}{README_START}\n{markdown(doc)}\n{README_END}{tail}", encoding="utf-8")
    return True


