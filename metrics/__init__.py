"""Prometheus metrics of the service, added up over every gunicorn worker.

Under gunicorn (`tally serve` or `gunicorn app:app`), gunicorn.conf.py calls
`serving.metrics_folder.prepare()` in the master before anything imports prometheus_client, so
every worker writes its values to files in one fresh folder (prometheus-client's
multiprocess mode) and `GET /metrics` (api/metrics.py) adds them up. Elsewhere (the
in-process test app) the values stay in this process. Call sites use the small functions
below, so instrumenting a step is one line.

Nothing is counted, and prometheus-client is not imported, until `enable()`: the app calls
it when /metrics is on (TALLY_METRICS_TOKEN). With /metrics off nobody could read the
counts, and under gunicorn each count costs a request ~6 us (prometheus-client writes the
worker's file under a lock).
"""

from __future__ import annotations

_on = False


def enable() -> None:
    """Count from now on in this process (idempotent)."""
    global _on, LOCAL, REQUESTS, EVENTS, QUEUE_DEPTH, FLUSH_SECONDS, FLUSH_BATCH
    global PAYMENT_UPSERTS, STRIPE_EVENTS, REPORT_SECONDS
    if _on:
        return
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    # The values of this process, for when there is no multiprocess folder.
    LOCAL = CollectorRegistry(auto_describe=True)

    REQUESTS = Counter("tally_http_requests", "HTTP requests answered, by route template, method and status.",
                       ["route", "method", "status"], registry=LOCAL)
    EVENTS = Counter("tally_events", "Events by outcome: accepted (queued), bot (dropped), refused with "
                     "quota_exceeded (429), too_many_requests (429, one address's rate on collect) "
                     "or rate_limited (503), identify_dropped (a browser $identify past its bound "
                     "per visitor and day), stored (committed by a flush), dead_lettered (set "
                     "aside by a flush that could not store them).",
                     ["outcome"], registry=LOCAL)
    QUEUE_DEPTH = Gauge("tally_event_queue_depth", "Events waiting in the workers' queues at their last flush.",
                        multiprocess_mode="livesum", registry=LOCAL)
    FLUSH_SECONDS = Histogram("tally_flush_duration_seconds", "Time to enrich and commit one flush batch.",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                              registry=LOCAL)
    FLUSH_BATCH = Histogram("tally_flush_batch_size", "Events stored by one flush.",
                            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000), registry=LOCAL)
    PAYMENT_UPSERTS = Counter("tally_payment_upserts", "Payments stored or updated.", registry=LOCAL)
    STRIPE_EVENTS = Counter("tally_stripe_events", "Verified Stripe webhook events by outcome (applied, "
                            "duplicate: seen before, ignored: a type Tally does not use) and type.",
                            ["outcome", "type"], registry=LOCAL)
    REPORT_SECONDS = Histogram("tally_report_duration_seconds", "Time to answer a stats request, by route.",
                               ["route"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                               registry=LOCAL)
    _on = True


def events_received(accepted: int, bots: int) -> None:
    if not _on:
        return
    if accepted:
        EVENTS.labels("accepted").inc(accepted)
    if bots:
        EVENTS.labels("bot").inc(bots)


def events_refused(code: str, count: int) -> None:
    """code: quota_exceeded or too_many_requests (429), rate_limited (503)."""
    if not _on:
        return
    EVENTS.labels(code).inc(count)


def identify_dropped() -> None:
    if not _on:
        return
    EVENTS.labels("identify_dropped").inc()


def events_flushed(count: int, seconds: float) -> None:
    if not _on:
        return
    EVENTS.labels("stored").inc(count)
    FLUSH_BATCH.observe(count)
    FLUSH_SECONDS.observe(seconds)


def events_dead_lettered(count: int) -> None:
    if not _on:
        return
    EVENTS.labels("dead_lettered").inc(count)


def queue_depth(events: int) -> None:
    if not _on:
        return
    QUEUE_DEPTH.set(events)


def payment_upserted() -> None:
    if not _on:
        return
    PAYMENT_UPSERTS.inc()


def stripe_event(outcome: str, event_type: str) -> None:
    """outcome: applied, duplicate or ignored; the type comes from a verified Stripe event."""
    if not _on:
        return
    STRIPE_EVENTS.labels(outcome, event_type[:80]).inc()
