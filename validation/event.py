"""The body of POST /api/v1/events, checked against the spec and cleaned.

`parse_events(body, now_ms)` takes what orjson parsed and returns the site id named by the
body and its events as `CleanEvent`s, or raises `InvalidEvent`, whose message names the
first invalid field, with the element's index in a batch: `invalid event input: b[3].u: ...`.
Fields are checked in a fixed order, so the same body always gets the same message.

Site checks (existence, ownership, hostnames) need the database and happen in the caller;
this module only extracts what they need (`CleanEvent.host`).
"""

from __future__ import annotations

import re
import socket
import sys
from typing import NamedTuple

import orjson

from vocabulary import IDENTIFY, PAGEVIEW, TS_FUTURE_MS, TS_PAST_MS

MAX_BODY_BYTES = 8_192
MAX_BATCH = 50
URL_MAX_BYTES = 2_048
TITLE_MAX_BYTES = 512
LANGUAGE_MAX_BYTES = 35
UID_MAX_BYTES = 128
PROPS_MAX_BYTES = 2_048
WIDTH_MAX = 32_767
# A `ts` outside [receipt - TS_PAST_MS, receipt + TS_FUTURE_MS] is replaced by the receipt time.
EVENT_FIELDS = frozenset({"e", "u", "r", "t", "w", "l", "uid", "p", "ts", "ip", "ua"})
SINGLE_FIELDS = EVENT_FIELDS | {"s"}
BATCH_FIELDS = frozenset({"s", "b"})
ELEMENT_FIELDS = SINGLE_FIELDS  # an element may repeat the batch's `s`

# Pages repeat across events: each valid URL's parts are found once, then looked up (one
# hash of the URL, as interning it costs). Bounded in entries and in each URL's length, so
# a flood of distinct URLs holds at most ~PAGE_MEMO_ENTRIES * PAGE_MEMO_CHARS bytes.
PAGE_MEMO_ENTRIES = 1_024
PAGE_MEMO_CHARS = 256
_pages: dict[str, tuple[str, str, int]] = {}

_EVENT_NAME = re.compile(r"[A-Za-z0-9 _-]{1,64}")
# The names nearly every event carries: valid as they are, and held once, not per event.
_COMMON_NAMES = {PAGEVIEW: PAGEVIEW, IDENTIFY: IDENTIFY}
# scheme://[userinfo@]host[:port] followed by the end or one of / ? #. Group 1 is the host.
_HTTP_URL = re.compile(
    r"[hH][tT][tT][pP][sS]?://(?:[^/?#@]*@)?(\[[0-9A-Fa-f:.]+\]|[^/?#:@\[\]\s]+)(?::[0-9]*)?(?=[/?#]|\Z)"
)

_IPV4_MAPPED = bytes(10) + b"\xff\xff"

MESSAGES = {
    "body": "must be a JSON object",
    "s": "required, the site id (a string)",
    "b": f"must be a list of 1 to {MAX_BATCH} events",
    "element": "must be an object",
    "element.s": "events for different sites in one batch",
    "e": "required, pageview, $identify, or 1-64 letters, digits, spaces, underscores or hyphens",
    "u": f"required, an absolute http or https URL of at most {URL_MAX_BYTES} bytes",
    "r": f"must be a string of at most {URL_MAX_BYTES} bytes",
    "t": "must be a string",
    "w": f"must be an integer from 0 to {WIDTH_MAX}",
    "l": "must be a string",
    "uid": f"must be a string of 1-{UID_MAX_BYTES} bytes",
    "uid.identify": f"required for $identify, a string of 1-{UID_MAX_BYTES} bytes",
    "p": f"must be a JSON object of at most {PROPS_MAX_BYTES} bytes",
    "ts": "must be an integer (unix milliseconds)",
    "ip": "must be an IPv4 or IPv6 address",
    "ua": "must be a string",
    "unknown": "unknown field",
}


class InvalidEvent(ValueError):
    """A field of the body breaks the spec; the message names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"invalid event input: {field}: {message}")
        self.field = field


class CleanEvent(NamedTuple):
    name: str
    ts: int
    url: str
    host: str  # lower case, no port, no trailing dot
    authority_end: int  # index in `url` where the path begins
    referrer: str | None
    title: str | None
    width: int | None
    language: str | None
    uid: str | None
    props: str | None  # compact JSON text
    ip_packed: bytes | None  # the address: 4 or 16 bytes, one spelling per address
    # Interned: a queue of events sent by a few browsers holds each agent once.
    ua: str | None


def parse_events(body: object, now_ms: int) -> tuple[str, list[CleanEvent]]:
    """(site id, events) of a single-event or batch body."""
    if type(body) is not dict:
        raise InvalidEvent("body", MESSAGES["body"])
    if "b" not in body:
        _reject_unknown(body, SINGLE_FIELDS, "")
        site = _site(body)
        return site, [_event(body, now_ms, None)]
    _reject_unknown(body, BATCH_FIELDS, "")
    site = _site(body)
    elements = body["b"]
    if type(elements) is not list or not 1 <= len(elements) <= MAX_BATCH:
        raise InvalidEvent("b", MESSAGES["b"])
    events = []
    for index, element in enumerate(elements):
        if type(element) is not dict:
            raise InvalidEvent(f"b[{index}]", MESSAGES["element"])
        if not element.keys() <= ELEMENT_FIELDS:
            _reject_unknown(element, ELEMENT_FIELDS, f"b[{index}].")
        if "s" in element and element["s"] != site:
            raise InvalidEvent(f"b[{index}].s", MESSAGES["element.s"])
        events.append(_event(element, now_ms, index))
    return site, events


def _reject_unknown(obj: dict, allowed: frozenset, where: str) -> None:
    if not obj.keys() <= allowed:
        raise InvalidEvent(where + min(obj.keys() - allowed), MESSAGES["unknown"])


def _site(body: dict) -> str:
    site = body.get("s")
    if type(site) is not str or not site:
        raise InvalidEvent("s", MESSAGES["s"])
    return site


def _field(index: int | None, name: str) -> str:
    """The field's name in messages: `u`, or `b[3].u` for a batch's fourth event."""
    return name if index is None else f"b[{index}].{name}"


def _event(obj: dict, now_ms: int, index: int | None) -> CleanEvent:
    get = obj.get

    sent_name = get("e")
    name = _COMMON_NAMES.get(sent_name) if type(sent_name) is str else None
    if name is None:
        if type(sent_name) is not str or _EVENT_NAME.fullmatch(sent_name) is None:
            raise InvalidEvent(_field(index, "e"), MESSAGES["e"])
        name = sent_name

    url = get("u")
    page = _pages.get(url) if type(url) is str else None
    if page is None:
        page = _page(url)
        if page is None:
            raise InvalidEvent(_field(index, "u"), MESSAGES["u"])
    url, host, authority_end = page

    referrer = get("r")
    if referrer is not None:
        if type(referrer) is not str or not _fits(referrer, URL_MAX_BYTES):
            raise InvalidEvent(_field(index, "r"), MESSAGES["r"])
        referrer = _intern(referrer) if referrer else None

    title = get("t")
    if title is not None:
        if type(title) is not str:
            raise InvalidEvent(_field(index, "t"), MESSAGES["t"])
        title = truncate_utf8(title, TITLE_MAX_BYTES)

    width = get("w")
    if width is not None and (type(width) is not int or not 0 <= width <= WIDTH_MAX):
        raise InvalidEvent(_field(index, "w"), MESSAGES["w"])

    language = get("l")
    if language is not None:
        if type(language) is not str:
            raise InvalidEvent(_field(index, "l"), MESSAGES["l"])
        language = truncate_utf8(language, LANGUAGE_MAX_BYTES)

    uid = get("uid")
    if uid is None:
        if name == IDENTIFY:
            raise InvalidEvent(_field(index, "uid"), MESSAGES["uid.identify"])
    elif type(uid) is not str or not uid or not _fits(uid, UID_MAX_BYTES):
        key = "uid.identify" if name == IDENTIFY else "uid"
        raise InvalidEvent(_field(index, "uid"), MESSAGES[key])

    props = get("p")
    if props is not None:
        if type(props) is not dict:
            raise InvalidEvent(_field(index, "p"), MESSAGES["p"])
        if props:
            text = _dumps(props)
            if len(text) > PROPS_MAX_BYTES:
                raise InvalidEvent(_field(index, "p"), MESSAGES["p"])
            props = text.decode()
        else:
            props = None

    ts = get("ts")
    if ts is None:
        ts = now_ms
    elif type(ts) is not int:
        raise InvalidEvent(_field(index, "ts"), MESSAGES["ts"])
    elif not now_ms - TS_PAST_MS <= ts <= now_ms + TS_FUTURE_MS:
        ts = now_ms

    ip = get("ip")
    ip_packed = None
    if ip is not None:
        if type(ip) is str:
            ip_packed = pack_ip(ip)
        if ip_packed is None:
            raise InvalidEvent(_field(index, "ip"), MESSAGES["ip"])

    ua = get("ua")
    if ua:
        if type(ua) is not str:
            raise InvalidEvent(_field(index, "ua"), MESSAGES["ua"])
        # Its hash, computed here, is the one the bot check and the flush's parser cache use.
        ua = _intern(ua)
    elif ua is not None and type(ua) is not str:
        raise InvalidEvent(_field(index, "ua"), MESSAGES["ua"])

    return _new_event(CleanEvent, (name, ts, url, host, authority_end, referrer, title, width,
                                   language, uid, props, ip_packed, ua or None))


def _page(url: object) -> tuple[str, str, int] | None:
    """(url, host, authority_end) of a valid page URL, else None; remembered in `_pages`."""
    if type(url) is not str or not _fits(url, URL_MAX_BYTES):
        return None
    match = _url_match(url)
    if match is None:
        return None
    # Interned, as the agent: a full queue holds each page, host and referrer once, and
    # the hash computed here is the one the host check and the flush's caches use.
    page = (_intern(url), _intern(match.group(1).lower().rstrip(".")), match.end())
    if len(url) <= PAGE_MEMO_CHARS:
        if len(_pages) >= PAGE_MEMO_ENTRIES:
            _pages.clear()
        _pages[page[0]] = page
    return page


_url_match = _HTTP_URL.match
_intern = sys.intern
_dumps = orjson.dumps
# CleanEvent(...) less its generated __new__'s Python frame: the fields are given in order.
_new_event = tuple.__new__


def _fits(text: str, limit: int) -> bool:
    """At most `limit` bytes in UTF-8 (ASCII text needs no encoding to tell)."""
    if len(text) > limit:
        return False
    return text.isascii() or len(text.encode()) <= limit


def truncate_utf8(text: str, limit: int) -> str:
    """The longest prefix of at most `limit` UTF-8 bytes that ends on a character boundary."""
    if text.isascii():
        return text[:limit]
    data = text.encode()
    if len(data) <= limit:
        return text
    # orjson refuses lone surrogates, so the only invalid bytes are a cut character's.
    return data[:limit].decode("utf-8", "ignore")


def pack_ip(text: str) -> bytes | None:
    """The 4 or 16 bytes of an IPv4 or IPv6 address, or None when it is not one."""
    try:
        return socket.inet_pton(socket.AF_INET, text)
    except OSError:
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, text)
    except OSError:
        return None
    # ::ffff:a.b.c.d is the IPv4 address a.b.c.d seen through an IPv6 socket.
    return packed[12:] if packed[:12] == _IPV4_MAPPED else packed
