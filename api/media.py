"""Response bodies through Falcon's media handling: set `resp.media` and the handler
installed here writes it with orjson, a Decimal as an exact JSON number (12.50 stays 12.50)."""

from __future__ import annotations

import falcon
import orjson
from falcon import media

from reports.money.amounts import dumps


def install(app: falcon.App) -> None:
    handler = media.JSONHandler(dumps=dumps, loads=orjson.loads)
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = handler
    app.req_options.media_handlers[falcon.MEDIA_JSON] = handler
