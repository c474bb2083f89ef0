"""A site's named funnels (scope `read`, like the reports that draw them):
GET /api/v1/funnels lists them, POST /api/v1/funnels stores one (replacing the site's
funnel of that name), DELETE /api/v1/funnels/{name} removes one. A key only ever sees its
own site's; another site's funnel is 404 like an unknown one. GET /api/v1/stats/funnel
with funnel=NAME draws a stored one."""

from __future__ import annotations

import falcon

from api.auth import Authenticator, key_scope
from api.bodies import parse_json, read_limited
from api.errors import invalid_input, not_found
from reports.funnels.steps import check_name, check_steps
from reports.shared.params import InvalidReportParameter
from storage.directory import InvalidArgument
from storage.funnels import Funnels

BODY_LIMIT = 8 * 1024


def checked_funnel(body: object) -> tuple[str, list[str]]:
    """(name, steps) of a request body {"name", "steps"}: steps a list of strings or one
    string of steps separated by commas."""
    if not isinstance(body, dict):
        raise InvalidReportParameter('body: must be an object {"name", "steps"}')
    unknown = sorted(set(body) - {"name", "steps"})
    if unknown:
        raise InvalidReportParameter(f"body: unknown field {unknown[0]!r}; give name and steps")
    name = check_name(body.get("name"))
    raw = body.get("steps")
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise InvalidReportParameter(
            "steps: a list of 2 to 8 steps, each page:/PATH, goal:NAME or payment")
    return name, [s.text() for s in check_steps(raw)]


class FunnelsResource:
    def __init__(self, auth: Authenticator, funnels: Funnels):
        self.auth = auth
        self.funnels = funnels

    @falcon.before(key_scope("read"))
    def on_get(self, req, resp):
        resp.media = {"ok": True,
                      "data": {"funnels": self.funnels.list(req.context.key.site_id)}}

    @falcon.before(key_scope("read"))
    def on_post(self, req, resp):
        try:
            name, steps = checked_funnel(parse_json(read_limited(req, BODY_LIMIT)))
            saved = self.funnels.save(req.context.key.site_id, name, steps)
        except (InvalidReportParameter, InvalidArgument) as exc:
            raise invalid_input(str(exc)) from None
        resp.status = falcon.HTTP_201
        resp.media = {"ok": True, "data": saved}


class FunnelResource:
    def __init__(self, auth: Authenticator, funnels: Funnels):
        self.auth = auth
        self.funnels = funnels

    @falcon.before(key_scope("read"))
    def on_delete(self, req, resp, name: str):
        if not self.funnels.delete(req.context.key.site_id, name):
            raise not_found(f"no funnel named {name!r} on this site")
        resp.status = falcon.HTTP_204


def add_funnel_routes(app: falcon.App, auth: Authenticator, funnels: Funnels) -> None:
    app.add_route("/api/v1/funnels", FunnelsResource(auth, funnels))
    app.add_route("/api/v1/funnels/{name}", FunnelResource(auth, funnels))
