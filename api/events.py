"""POST /api/v1/events: auth, size, fields, site, bots, quota, queue; then 204.

The request path reads (keys and sites through 1-second caches, the shared monthly count
at most once a second) and never writes: accepted events go on this worker's queue and
the flush thread stores them.
"""

from __future__ import annotations

from collections.abc import Callable

import metrics
from api.auth import Authenticator
from api.bodies import parse_json, read_limited
from api.caches import TTLCache
from api.errors import forbidden, invalid_input, not_found, quota_exceeded, rate_limited
from enrichment.agents import BotFilter
from enrichment.visitor import utc_day
from ingest.flusher import Flusher
from ingest.queue import Accepted
from quota.usage import QuotaGuard, UtcMonths, counted_events, seconds_until_next_month
from validation.event import MAX_BATCH, MAX_BODY_BYTES, InvalidEvent, parse_events

MAX_SITE_ID_LENGTH = 64
_new_unit = tuple.__new__
ANONYMOUS_QUOTA_MESSAGE = ("monthly event quota for anonymous events exceeded; the rest is kept"
                           " for the site's keyed events; it resets at the start of next month"
                           " (UTC)")


class EventsResource:
    def __init__(self, auth: Authenticator, sites: TTLCache, bots: BotFilter,
                 quota: QuotaGuard, flusher: Flusher, clock: Callable[[], float]):
        self.auth = auth
        self.sites = sites
        self.bots = bots
        self.quota = quota
        self.flusher = flusher
        self.clock = clock
        self.months = UtcMonths()

    def on_post(self, req, resp):
        # What key_scope("events") would do as a hook, called here: the same checks in the
        # same order (before any body is read), without the hook's wrapper per request.
        key = self.auth.authenticate(req.auth, "events")
        data = read_limited(req, MAX_BODY_BYTES)
        self.refuse_when_full(data)
        body = parse_json(data)
        now = self.clock()
        site_id, events = self.parse(body, now)
        site = self.find_site(site_id)
        if site.id != key.site_id:
            raise forbidden("this API key belongs to another site")
        self.accept(site, events, body, now)
        resp.status = 204

    def refuse_when_full(self, data: bytes) -> None:
        """503 before any parsing when the queue has no room for the body's events. Every
        event carries its own "u" key, so the body's count of `"u"` is at least its
        events; under back pressure a batch is then refused for a few microseconds
        instead of after its whole validation. A body the count overstates is at worst
        refused a moment early, as it would be with the queue that much fuller."""
        room = self.flusher.queue.room
        if room >= MAX_BATCH:
            return
        events = min(MAX_BATCH, max(1, data.count(b'"u"')))
        if room < events:
            metrics.events_refused("rate_limited", events)
            raise rate_limited()

    # The steps below are shared with POST /api/v1/collect (api/collect.py).
    @staticmethod
    def parse(body, now: float):
        try:
            return parse_events(body, int(now * 1000))
        except InvalidEvent as exc:
            raise invalid_input(str(exc)) from None

    def find_site(self, site_id: str):
        # No site id is that long: answer without a look-up, so the cache keeps short keys.
        site = self.sites.get(site_id) if len(site_id) <= MAX_SITE_ID_LENGTH else None
        if site is None:
            raise not_found(f"no site {site_id[:64]}")
        return site

    def accept(self, site, events: list, body: dict, now: float) -> None:
        """Hostnames, bots, quota and queue for keyed events of `site`; raises the refusal."""
        kept = self.admit(site, events, body, now)
        self.enqueue(site, kept, len(events) - len(kept), now, counted_events(kept))

    def admit(self, site, events: list, body: dict, now: float, anonymous: bool = False) -> list:
        """The events to keep (bots dropped) once hostnames and quota allow them; raises
        the refusal. Anonymous events stop short of the cap (quota.plans.anonymous_limit)."""
        # Hostnames (step 4) of every event are checked before any is dropped as a bot
        # (step 5): a refusal aborts the request, so one pass does both.
        hosts, is_bot = site.hosts, self.bots.is_bot
        kept: list = []
        for index, event in enumerate(events):
            if event.host not in hosts:
                field = "u" if "b" not in body else f"b[{index}].u"
                raise invalid_input(f"invalid event input: {field}: host {event.host}"
                                    " is not a hostname of this site")
            if event.ua is not None and is_bot(event.ua):
                continue
            kept.append(event)
        usage_key = (site.account_id, self.months.name(now))
        if self.quota.over_cap(usage_key, site.plan):
            metrics.events_refused("quota_exceeded", len(events))
            raise quota_exceeded(seconds_until_next_month(now))
        if anonymous and self.quota.over_cap(usage_key, site.plan, anonymous=True):
            metrics.events_refused("quota_exceeded", len(events))
            raise quota_exceeded(seconds_until_next_month(now), ANONYMOUS_QUOTA_MESSAGE)
        return kept

    def enqueue(self, site, kept: list, bots: int, now: float, counted: int,
                browser_id: str | None = None, anonymous: bool = False,
                links_identity: bool = True) -> None:
        """Hold the counted events and queue the unit (503 when the queue is full)."""
        if kept:
            month = self.months.name(now)
            usage_key = (site.account_id, month)
            # Accepted(...) without its generated __new__'s frame (every field given, in
            # order).
            unit = _new_unit(Accepted, (site.id, site.account_id, month,
                                        utc_day(int(now * 1000)), kept, counted,
                                        browser_id, anonymous, links_identity))
            anonymous_counted = counted if anonymous else 0
            self.quota.hold(usage_key, counted, anonymous_counted)
            if not self.flusher.submit(unit):
                self.quota.release(usage_key, counted, anonymous_counted)
                metrics.events_refused("rate_limited", len(kept) + bots)
                raise rate_limited()
        metrics.events_received(len(kept), bots)


def build_events(config, auth: Authenticator, directory, quota: QuotaGuard, flusher: Flusher,
                 clock: Callable[[], float]) -> EventsResource:
    """The resource, handing what it accepts to `flusher` (built by the app factory)."""
    sites = TTLCache(directory.find_site, clock, ttl=config.cache_ttl,
                     max_entries=config.cache_entries)
    return EventsResource(auth, sites, BotFilter(config.cache_entries), quota, flusher, clock)
