"""POST /api/v1/collect: the tracking script's events, public (no key), one per request.

The body is the events API's single form without `ip` and `ua`, plus `v`, the browser's
visitor id (the `tally_vid` cookie; absent in cookieless mode). The client address comes
from the connection or, behind a trusted proxy, from X-Forwarded-For (api/client_ip.py);
the user agent from the User-Agent header. Everything after that, from the messages to
the queue, is the events API's own path (api/events.py).

Any origin may post: the site's hostnames decide, not the page's origin. The script sends
text/plain, a simple request; OPTIONS answers preflights of other callers.
"""

from __future__ import annotations

from api.bodies import parse_json, read_limited
from api.client_ip import Network, client_ip
from api.errors import invalid_input
from api.events import EventsResource
from enrichment.browser_ids import is_browser_id
from validation.event import MAX_BODY_BYTES, MESSAGES, SINGLE_FIELDS, InvalidEvent

COLLECT_FIELDS = (SINGLE_FIELDS - {"ip", "ua"}) | {"v"}
V_MESSAGE = "must be the visitor id of tally.js, 32 lower-case hexadecimal digits"
CORS_HEADERS = {"Access-Control-Allow-Origin": "*"}
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type",
    "Access-Control-Max-Age": "86400",
}


class CollectResource:
    def __init__(self, intake: EventsResource, trusted_proxies: tuple[Network, ...]):
        self.intake = intake
        self.trusted_proxies = trusted_proxies

    def on_options(self, req, resp):
        resp.set_headers(CORS_HEADERS)
        resp.set_headers(PREFLIGHT_HEADERS)
        resp.status = 204

    def on_post(self, req, resp):
        resp.set_headers(CORS_HEADERS)  # error answers keep them: the page may read why
        body = parse_json(read_limited(req, MAX_BODY_BYTES))
        intake = self.intake
        now = intake.clock()
        browser_id = None
        if type(body) is dict:
            unknown = body.keys() - COLLECT_FIELDS
            if unknown:
                raise invalid_input(str(InvalidEvent(min(unknown), MESSAGES["unknown"])))
            browser_id = body.pop("v", None)
            ip = client_ip(req.env.get("REMOTE_ADDR", ""), req.get_header("X-Forwarded-For"),
                           self.trusted_proxies)
            if ip is not None:
                body["ip"] = ip
            ua = req.get_header("User-Agent")
            if ua:
                body["ua"] = ua
        site_id, events = intake.parse(body, now)
        if browser_id is not None and not is_browser_id(browser_id):
            raise invalid_input(str(InvalidEvent("v", V_MESSAGE)))
        site = intake.find_site(site_id)
        intake.accept(site, events, body, now, browser_id)
        resp.status = 204
