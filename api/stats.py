"""GET /api/v1/stats/*: revenue, MRR, MRR movements, traffic aggregate, breakdown, time
series, goals, realtime and funnels.

Scope `read`; a key only ever sees its own site. Parameters are checked by
reports.shared.params and a bad one is 400 invalid_input with its message. Breakdown, revenue
and time series answer CSV for `format=csv` or an Accept header naming text/csv.
"""

from __future__ import annotations

from collections.abc import Callable

import falcon

from api.auth import Authenticator, key_scope
from api.errors import invalid_input
from reports.service import run_report
from reports.shared.csv_text import CSV_REPORTS, as_csv, wants_csv
from reports.shared.params import InvalidReportParameter
from storage.db import Database
from storage.reads import ReadPool

# Route -> report name (reports.service.REPORTS).
STATS_ROUTES = {
    "/api/v1/stats/revenue": "revenue",
    "/api/v1/stats/mrr": "mrr",
    "/api/v1/stats/mrr/movements": "movements",
    "/api/v1/stats/aggregate": "aggregate",
    "/api/v1/stats/breakdown": "breakdown",
    "/api/v1/stats/timeseries": "timeseries",
    "/api/v1/stats/goals": "goals",
    "/api/v1/stats/realtime": "realtime",
    "/api/v1/stats/funnel": "funnel",
}


class StatsResource:
    def __init__(self, report: str, auth: Authenticator, db: Database,
                 clock: Callable[[], float], reads: ReadPool, flush_interval: float = 1.0):
        self.report = report
        self.flush_interval = flush_interval
        self.auth = auth
        self.db = db
        self.clock = clock
        self.reads = reads

    @falcon.before(key_scope("read"))
    def on_get(self, req, resp):
        params = dict(req.params)
        site_id, now = req.context.key.site_id, self.clock()
        try:
            csv = self.report in CSV_REPORTS and wants_csv(params, req.get_header("Accept"))
            # Past the budget, ReadBudgetExceeded: 422 query_too_expensive (api.errors).
            data = self.reads.call(_report, self.report, site_id, params, now,
                                   self.flush_interval)
        except InvalidReportParameter as exc:
            raise invalid_input(str(exc)) from None
        if csv:
            resp.content_type = "text/csv; charset=utf-8"
            resp.set_header("Content-Disposition", f'attachment; filename="{self.report}.csv"')
            resp.data = as_csv(self.report, data).encode()
            return
        resp.media = {"ok": True, "data": data}


def _report(db: Database, report: str, site_id: int, params: dict, now: float,
            flush_interval: float):
    return run_report(report, db, site_id, params, now, max_delay_seconds=flush_interval)


def add_stats_routes(app, auth: Authenticator, db: Database, clock: Callable[[], float],
                     reads: ReadPool, flush_interval: float = 1.0) -> None:
    """`reads`: where reports run, within their budget; `flush_interval`: how late an
    accepted event can reach the database (realtime says it)."""
    for path, report in STATS_ROUTES.items():
        app.add_route(path, StatsResource(report, auth, db, clock, reads, flush_interval))
