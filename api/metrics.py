"""GET /metrics in Prometheus text format, and the middleware that counts requests.

Off (404) unless TALLY_METRICS_TOKEN is set; then it requires `Authorization: Bearer
<token>`. Database and WAL sizes are read at each scrape (SQLite: the files; PostgreSQL:
its tables and indexes, and no WAL of Tally's own). prometheus-client is imported only when
metrics are on (metrics.enable).
"""

from __future__ import annotations

import hmac
import time

import metrics
from api.errors import not_found, unauthorized

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
REPORT_ROUTES = "/api/v1/stats/"


class DatabaseSizes:
    def __init__(self, db):
        self.db = db

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        try:
            database, wal = self.db.size_bytes()
        except Exception:  # noqa: BLE001 - a scrape reports what it can; the database may be down
            database, wal = 0, 0
        yield GaugeMetricFamily("tally_database_size_bytes",
                                "Size of the database (SQLite file, or PostgreSQL tables and indexes).",
                                value=database)
        yield GaugeMetricFamily("tally_wal_size_bytes", "Size of SQLite's write-ahead log.",
                                value=wal)


class MetricsResource:
    def __init__(self, token: str | None, db):
        self.token = token.encode() if token else None
        self.sizes = DatabaseSizes(db)

    def on_get(self, req, resp):
        if self.token is None:
            raise not_found("metrics are off: set TALLY_METRICS_TOKEN")
        given = (req.get_header("Authorization") or "").encode()
        if not hmac.compare_digest(given, b"Bearer " + self.token):
            raise unauthorized("a valid metrics token is required")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(self.registry())

    def registry(self):
        from prometheus_client import CollectorRegistry, values
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        if values.ValueClass is values.MutexValue:  # no multiprocess folder: this process only
            registry.register(_Local())
        else:  # prometheus-client finds the folder gunicorn's master made (metrics_folder)
            MultiProcessCollector(registry)
        registry.register(self.sizes)
        return registry


class _Local:
    def collect(self):
        return metrics.LOCAL.collect()


class RequestMetrics:
    """Falcon middleware: requests by route template (never the raw path), method, status."""

    def process_request(self, req, resp):
        req.context.metrics_started = time.monotonic()

    def process_response(self, req, resp, resource, req_succeeded):
        route = req.uri_template or "unmatched"
        method = req.method if req.method in METHODS else "other"
        metrics.REQUESTS.labels(route, method, str(resp.status_code)).inc()
        if route.startswith(REPORT_ROUTES):
            started = getattr(req.context, "metrics_started", None)
            if started is not None:
                metrics.REPORT_SECONDS.labels(route).observe(time.monotonic() - started)
