"""POST /api/v1/collect: the tracking script's events, public (no key), one per request.

The body is the events API's single form without `ip` and `ua`, plus `v`, the browser's
visitor id (the `tally_vid` cookie; absent in cookieless mode), and `uh`, with `$identify`,
the identity hash the site's server gave the page (attribution/identity.py). The client
address comes from the connection or, behind a trusted proxy, from X-Forwarded-For
(api/client_ip.py); the user agent from the User-Agent header. Everything after that, from
the messages to the queue, is the events API's own path (api/events.py), with what
anonymous traffic may use on top (quota/anonymous.py): a request rate per client address
block, a quota that stops short of the cap, every event counted, and `$identify` bounded
per visitor and day and linking a user only when its hash verifies.

Any origin may post: the site's hostnames decide, not the page's origin. The script sends
text/plain, a simple request; OPTIONS answers preflights of other callers.
"""

from __future__ import annotations

import hashlib

import metrics
from api.bodies import parse_json, read_limited
from api.caches import TTLCache
from api.client_ip import Network, address_block, client_ip
from api.errors import ApiError, invalid_input, too_many_requests
from api.events import EventsResource
from attribution.identity import HASH_MAX_CHARS, vouched
from enrichment.browser_ids import is_browser_id
from enrichment.visitor import utc_day
from quota.anonymous import AddressRate, IdentifyBudget
from storage.identity_secrets import site_secret
from validation.event import MAX_BODY_BYTES, MESSAGES, SINGLE_FIELDS, InvalidEvent
from vocabulary import IDENTIFY

COLLECT_FIELDS = (SINGLE_FIELDS - {"ip", "ua"}) | {"v", "uh"}
V_MESSAGE = ("must be the visitor id of tally.js, 32 lower-case hexadecimal digits,"
             " optionally after 4 such digits and a dot")
UH_MESSAGE = (f"must be a string of at most {HASH_MAX_CHARS} characters, sent with $identify"
              " only (the hex HMAC-SHA256 of uid under the site's identity secret)")
CORS_HEADERS = {"Access-Control-Allow-Origin": "*"}
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type",
    "Access-Control-Max-Age": "86400",
}


class CollectResource:
    def __init__(self, intake: EventsResource, trusted_proxies: tuple[Network, ...],
                 rate: AddressRate, identifies: IdentifyBudget, identity_secrets: TTLCache):
        self.intake = intake
        self.trusted_proxies = trusted_proxies
        self.rate = rate
        self.identifies = identifies
        self.identity_secrets = identity_secrets  # site id -> its identity secret or None

    def on_options(self, req, resp):
        resp.set_headers(CORS_HEADERS)
        resp.set_headers(PREFLIGHT_HEADERS)
        resp.status = 204

    def on_post(self, req, resp):
        resp.set_headers(CORS_HEADERS)  # error answers keep them: the page may read why
        ip = client_ip(req.env.get("REMOTE_ADDR", ""), req.get_header("X-Forwarded-For"),
                       self.trusted_proxies)
        if ip is not None:
            wait = self.rate.take(address_block(ip))
            if wait:
                metrics.events_refused("too_many_requests", 1)
                raise too_many_requests(wait)
        body = parse_json(read_limited(req, MAX_BODY_BYTES))
        intake = self.intake
        now = intake.clock()
        browser_id = identity_hash = ua = None
        if type(body) is dict:
            unknown = body.keys() - COLLECT_FIELDS
            if unknown:
                raise invalid_input(str(InvalidEvent(min(unknown), MESSAGES["unknown"])))
            browser_id = body.pop("v", None)
            identity_hash = body.pop("uh", None)
            if ip is not None:
                body["ip"] = ip
            ua = req.get_header("User-Agent")
            if ua:
                body["ua"] = ua
        site_id, events = intake.parse(body, now)
        if browser_id is not None and not is_browser_id(browser_id):
            raise invalid_input(str(InvalidEvent("v", V_MESSAGE)))
        (event,) = events  # collect takes the single form only
        if identity_hash is not None and (
                type(identity_hash) is not str or len(identity_hash) > HASH_MAX_CHARS
                or event.name != IDENTIFY):
            raise invalid_input(str(InvalidEvent("uh", UH_MESSAGE)))
        site = intake.find_site(site_id)
        kept = intake.admit(site, events, body, now, anonymous=True)
        links_identity, undo = True, None
        if kept and event.name == IDENTIFY:
            links_identity = vouched(self.identity_secrets.get(site.id), event.uid,
                                     identity_hash)
            undo = self.identifies.claim(visitor_key(site.id, browser_id, ip, ua),
                                         utc_day(int(now * 1000)), event.uid, links_identity)
            if undo is None:  # already recorded today, or the visitor's user ids are used up
                metrics.identify_dropped()
                resp.status = 204
                return
        try:
            intake.enqueue(site, kept, len(events) - len(kept), now, len(kept), browser_id,
                           anonymous=True, links_identity=links_identity)
        except ApiError:
            if undo is not None:
                undo()
            raise
        resp.status = 204


def visitor_key(site_id: int, browser_id: str | None, ip: str | None, ua: str | None) -> bytes:
    """Who sent an anonymous event, as far as the request tells: the browser id, else the
    ip + ua of which the day's visitor id is made."""
    who = f"v{browser_id}" if browser_id is not None else f"a{ip}\0{ua}"
    return hashlib.blake2b(f"{site_id}\0{who}".encode("utf-8", "surrogatepass"),
                           digest_size=16).digest()


def build_collect(config, db, intake: EventsResource) -> CollectResource:
    """The resource with its per-worker limits and a 1-second cache of identity secrets."""
    clock = intake.clock
    secrets = TTLCache(lambda site_id: site_secret(db.conn(), site_id), clock,
                       ttl=config.cache_ttl, max_entries=config.cache_entries)
    return CollectResource(
        intake, config.trusted_proxies,
        AddressRate(config.collect_rate, config.collect_burst, clock, config.cache_entries),
        IdentifyBudget(config.identifies_per_visitor, config.cache_entries), secrets)
