"""Tally's WSGI application.

`create_app` takes its dependencies (config, database, clock, randomness) and
returns the application; `app` below is what `gunicorn app:app` serves. Building
it opens no file and starts no thread: the database opens on first use, and
background threads start in `Tally.start()`, which gunicorn.conf.py calls in
each worker after the fork.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import falcon

import metrics
from api import errors, media
from api.auth import Authenticator, key_scope
from api.collect import build_collect
from api.deferred import DeferredResource
from api.events import build_events
from api.funnels import add_funnel_routes
from api.metrics import MetricsResource, RequestMetrics
from api.openapi import OpenApiDocument
from api.payments import PaymentsResource
from api.records import CustomerRecord, PaymentRecord
from api.script import TrackerScript
from api.stats import add_stats_routes
from config import READ_BUDGET, Config
from dashboard.routes import add_page_routes, responder_names
from enrichment.browser_ids import BrowserIds, BrowserVisitors
from enrichment.enricher import Enricher
from ingest.flusher import Flusher
from ingest.pipeline import BatchWriter
from ingest.queue import EventQueue
from quota.usage import QuotaGuard
from reports.days.ahead import BREAKDOWNS, store_final_days
from storage.backend import open_database
from storage.db import Database, ReadBudgetExceeded, StorageBusy, StorageError
from storage.directory import Directory
from storage.events import make_event_months
from storage.funnels import Funnels
from storage.payments import PaymentStore
from storage.read_processes import ReadGate, ReadProcesses, slots_for
from storage.reads import ReadPool
from tasks import Task, Tasks

log = logging.getLogger("tally")


class Health:
    def __init__(self, db: Database):
        self.db = db

    def on_get(self, req, resp):
        self.db.ping()
        resp.media = {"ok": True, "data": {"status": "ok"}}


class CurrentKey:
    """GET /api/v1/key: which key, site and scopes a secret stands for."""

    def __init__(self, auth: Authenticator):
        self.auth = auth

    @falcon.before(key_scope(None))
    def on_get(self, req, resp):
        key = req.context.key
        data = {"id": key.public_id, "site": key.site_public_id, "scopes": sorted(key.scopes)}
        resp.media = {"ok": True, "data": data}


class ReleaseConnection:
    """Gives the request thread's database connection back after every request, for the
    next request on any thread (a PostgreSQL pool's, or a SQLite one the Database lends)."""

    def __init__(self, db: Database):
        self.db = db

    def process_response(self, req, resp, resource, req_succeeded):
        self.db.release()


def build_flusher(config: Config, db: Database, quota: QuotaGuard, clock: Callable[[], float],
                  random_bytes: Callable[[int], bytes]) -> Flusher:
    """The worker's events queue and the flush thread (not started) that enriches what it
    holds and writes it (ingest/pipeline.py), browser ids and the quota's usage included."""
    enricher = Enricher(db, clock, random_bytes, config.cache_entries)
    browser_visitors = BrowserVisitors(BrowserIds(db, clock, random_bytes))
    return Flusher(db, EventQueue(config.queue_max), enricher,
                   interval=config.flush_interval, quota=quota,
                   write=BatchWriter(browser_visitors),
                   busy_timeout_ms=config.flush_busy_timeout_ms, backoff=config.flush_backoff,
                   clock=clock)


class Tally:
    """The WSGI callable plus the lifecycle of its background work."""

    def __init__(self, config: Config, db: Database, clock: Callable[[], float],
                 random_bytes: Callable[[int], bytes], *, read_processes: bool = False):
        self.config = config
        self.db = db
        self.clock = clock
        self.random_bytes = random_bytes
        self.directory = Directory(db, clock, random_bytes)
        self.auth = Authenticator(self.directory, clock, ttl=config.cache_ttl,
                                  max_entries=config.cache_entries)
        self.services: list = []
        self.wsgi = falcon.App(media_type="application/json")
        media.install(self.wsgi)
        errors.install(self.wsgi)
        if config.metrics_token:
            # Counting costs a request ~17 us by route and ~6 us by events (prometheus-client's
            # files under gunicorn); with /metrics off nobody could read the counts.
            metrics.enable()
            self.wsgi.add_middleware(RequestMetrics())
        self.wsgi.add_middleware(ReleaseConnection(db))
        self.wsgi.add_route("/metrics", MetricsResource(config.metrics_token, db))
        self.wsgi.add_route("/healthz", Health(db))
        self.wsgi.add_route("/api/v1/key", CurrentKey(self.auth))
        self.quota = QuotaGuard(db, clock, ttl=config.cache_ttl, max_entries=config.cache_entries,
                                keyed_reserve_percent=config.keyed_reserve_percent)
        self.flusher = build_flusher(config, db, self.quota, clock, random_bytes)
        self.services.append(self.flusher)
        self.events = build_events(config, self.auth, self.directory, self.quota, self.flusher,
                                   clock)
        self.wsgi.add_route("/api/v1/events", self.events)
        self.collect = build_collect(config, db, self.events)
        self.wsgi.add_route("/api/v1/collect", self.collect)
        self.wsgi.add_route("/js/tally.js", TrackerScript())
        self.payments = PaymentStore(db, clock)
        self.services.append(self.payments)
        self.wsgi.add_route("/api/v1/payments", PaymentsResource(self.auth, self.payments))
        self.wsgi.add_route("/api/v1/payments/{payment_id}", PaymentRecord(self.auth, db))
        self.wsgi.add_route("/api/v1/customers/{customer_id}", CustomerRecord(self.auth, db))
        # This route and the dashboard's load their modules on their first request: a worker
        # that only ingests never needs them (api/deferred.py).
        self.stripe_webhook = DeferredResource(self._stripe_webhook, ("on_post",))
        self.wsgi.add_route("/api/v1/integrations/stripe/{site_id}", self.stripe_webhook)
        # Every read over HTTP (a report, a dashboard page) runs on these, in its budget:
        # the site's own users and keys on one set, shared links' anonymous viewers on
        # another, so they cannot take the owner's. Under the server, in read processes
        # (storage/read_processes.py), one read at a time, the owner's first, and fewer
        # at once on the machine than its cores; else on threads of this process.
        self.read_gate = gate = ReadGate(slots_for(config))
        self.reads, self.anonymous_reads = (
            ReadProcesses(config, config.read_budget, processes=config.read_threads,
                          nice=config.read_nice, preload=("api.stats", "dashboard.web"),
                          gate=gate, first=first)
            if read_processes else
            ReadPool(db, config.read_budget, check_steps=config.read_budget_check_steps,
                     threads=config.read_threads, nice=config.read_nice)
            for first in (True, False))
        # The duty that counts final days ahead reads on a thread of this process at the
        # read processes' priority, in its turn after every waiting read: a worker that
        # only takes in events starts no read process for it.
        self.duty_reads = ReadPool(db, config.read_budget, threads=1, nice=config.read_nice,
                                   check_steps=config.read_budget_check_steps)
        self.services += [self.reads, self.anonymous_reads, self.duty_reads]
        add_stats_routes(self.wsgi, self.auth, db, clock, self.reads, config.flush_interval)
        add_funnel_routes(self.wsgi, self.auth, Funnels(db, clock))
        self.wsgi.add_route("/api/v1/openapi.json", OpenApiDocument())
        self.dashboard = DeferredResource(self._dashboard, responder_names())
        add_page_routes(self.wsgi, self.dashboard)
        # Every background duty of a worker, besides the events flush.
        self.tasks = Tasks([
            Task("prune visitor salts older than yesterday", every=60.0,
                 run=self._prune_salts),
            Task("make the coming months' event partitions (PostgreSQL)", every=3600.0,
                 run=self._make_event_months),
            # Not in a worker's first minutes: its start and first requests come first.
            Task("count recent final days of traffic ahead of the reports", every=3600.0,
                 first=600.0, run=self.count_final_days),
        ])
        self.services.append(self.tasks)

    def _stripe_webhook(self):
        from api.stripe_webhook import StripeWebhook
        from storage.stripe import StripeStore

        return StripeWebhook(self.directory, StripeStore(self.db, self.clock))

    def _dashboard(self):
        from dashboard.web import Dashboard

        return Dashboard(config=self.config, db=self.db, directory=self.directory,
                         clock=self.clock, random_bytes=self.random_bytes, reads=self.reads,
                         anonymous_reads=self.anonymous_reads)

    def __call__(self, environ, start_response):
        return self.wsgi(environ, start_response)

    def start(self) -> None:
        # Before the first flush, so that a new database's events go into their month's
        # partition; a busy database is no reason not to start (the duty tries again).
        try:
            self._make_event_months()
        except StorageError as exc:
            log.warning("could not make the coming months' event partitions yet (%s)", exc)
        for service in self.services:
            service.start()

    def _make_event_months(self) -> None:
        try:
            made = make_event_months(self.db, int(self.clock() * 1000))
        finally:
            self.db.release()
        if made:
            log.info("made the events partitions of %s", ", ".join(
                time.strftime("%Y-%m", time.gmtime(month / 1000)) for month in made))

    def count_final_days(self) -> int:
        """Count and store each site's recent final days (reports/days/ahead.py), each as a
        read after those waiting; how many reads ran. A read stopped at its budget keeps what
        it stored and the next turn goes on; a busy machine ends this turn."""
        now, ran = self.clock(), 0
        wait = self.config.read_budget or READ_BUDGET  # a duty never waits without end
        try:
            sites = [self.directory.find_site(site["id"]) for site in self.directory.list_sites()]
        finally:
            self.db.release()  # on PostgreSQL, a pooled connection: not held between reads
        for record in sites:
            for by in BREAKDOWNS:
                if record is None or self.tasks.stopping():
                    break
                try:
                    with self.read_gate.turn(first=False, wait=wait):
                        self.duty_reads.call(store_final_days, record.id, now, by)
                except ReadBudgetExceeded:
                    pass
                except StorageBusy as exc:
                    log.info("final days not counted ahead this time (%s)", exc)
                    return ran
                ran += 1
        return ran

    def _prune_salts(self) -> None:
        try:
            self.flusher.enricher.prune(self.db.conn())
        finally:
            self.db.release()

    def stop(self, timeout: float = 25.0) -> None:
        for service in reversed(self.services):
            service.stop(timeout)
        self.db.close()


def create_app(
    config: Config | None = None,
    *,
    db: Database | None = None,
    clock: Callable[[], float] = time.time,
    random_bytes: Callable[[int], bytes] = secrets.token_bytes,
    read_processes: bool = False,
) -> Tally:
    """`read_processes`: reads over HTTP in processes of their own (the server's way),
    else on threads of this process."""
    config = config or Config()
    db = db or open_database(config)
    return Tally(config, db, clock, random_bytes, read_processes=read_processes)


def create_app_from_env() -> Tally:
    return create_app(Config.from_env(), read_processes=True)


app = create_app_from_env()
