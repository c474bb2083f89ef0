"""validation/event.py: every rule of the spec's Event table, as a pure function."""

from __future__ import annotations

import orjson
import pytest

from validation.event import InvalidEvent, parse_events, truncate_utf8

NOW = 1_790_000_000_000
SITE = "site_abc"


def single(**fields) -> dict:
    return {"s": SITE, "e": "pageview", "u": "https://example.com/a", **fields}


def one(**fields):
    site, events = parse_events(single(**fields), NOW)
    assert site == SITE and len(events) == 1
    return events[0]


def refused(body) -> str:
    with pytest.raises(InvalidEvent) as info:
        parse_events(body, NOW)
    return str(info.value)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"e": None}, "e"),
        ({"e": ""}, "e"),
        ({"e": "x" * 65}, "e"),
        ({"e": "sign.up"}, "e"),
        ({"e": "café"}, "e"),
        ({"e": "$pageview"}, "e"),
        ({"e": 5}, "e"),
        ({"u": None}, "u"),
        ({"u": "example.com/a"}, "u"),
        ({"u": "ftp://example.com/a"}, "u"),
        ({"u": "https://"}, "u"),
        ({"u": "https:///path"}, "u"),
        ({"u": "/relative"}, "u"),
        ({"u": "https://example.com/" + "a" * 2029}, "u"),  # 2,049 bytes
        ({"u": "https://example.com/" + "é" * 1015}, "u"),  # 2,050 bytes, 1,035 characters
        ({"u": ["https://example.com/"]}, "u"),
        ({"r": 7}, "r"),
        ({"r": "https://ref.example/" + "a" * 2029}, "r"),
        ({"t": 1}, "t"),
        ({"w": -1}, "w"),
        ({"w": 32768}, "w"),
        ({"w": True}, "w"),
        ({"w": 100.0}, "w"),
        ({"w": "100"}, "w"),
        ({"l": ["en"]}, "l"),
        ({"uid": ""}, "uid"),
        ({"uid": 42}, "uid"),
        ({"uid": "u" * 129}, "uid"),
        ({"e": "$identify"}, "uid"),
        ({"e": "$identify", "uid": "é" * 65}, "uid"),  # 130 bytes
        ({"p": []}, "p"),
        ({"p": "x"}, "p"),
        ({"p": {"k": "v" * 2041}}, "p"),  # {"k":"v…"} is 2,049 bytes
        ({"ts": 1.5}, "ts"),
        ({"ts": "1790000000000"}, "ts"),
        ({"ts": True}, "ts"),
        ({"ip": "1.2.3"}, "ip"),
        ({"ip": "256.1.1.1"}, "ip"),
        ({"ip": "01.2.3.4"}, "ip"),
        ({"ip": " 1.2.3.4"}, "ip"),
        ({"ip": "::g"}, "ip"),
        ({"ip": 16909060}, "ip"),
        ({"ua": 1}, "ua"),
        ({"zz": 1}, "zz"),
        ({"S": SITE}, "S"),
    ],
)
def test_single_event_field_refused_with_its_name(fields, field):
    message = refused(single(**fields))
    assert message.startswith(f"invalid event input: {field}: ")


@pytest.mark.parametrize("body", [[], "x", 1, None, [single()]])
def test_body_must_be_an_object(body):
    assert refused(body) == "invalid event input: body: must be a JSON object"


@pytest.mark.parametrize("site", [None, "", 5, ["site_abc"]])
def test_site_is_required_as_a_string(site):
    body = single()
    body["s"] = site
    assert refused(body).startswith("invalid event input: s: ")
    del body["s"]
    assert refused(body).startswith("invalid event input: s: ")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"e": "pageview"}, ("name", "pageview")),
        ({"e": "$identify", "uid": "user-1"}, ("uid", "user-1")),
        ({"e": "Signed up - step_2"}, ("name", "Signed up - step_2")),
        ({"e": "x" * 64}, ("name", "x" * 64)),
        ({"u": "https://example.com/" + "a" * 2028}, ("url", "https://example.com/" + "a" * 2028)),
        ({"u": "HTTP://Example.COM:8080/a"}, ("host", "example.com")),
        ({"u": "https://user:pw@www.example.com./x?y#z"}, ("host", "www.example.com")),
        ({"u": "https://example.com"}, ("authority_end", 19)),
        ({"u": "https://[2001:db8::1]:443/"}, ("host", "[2001:db8::1]")),
        ({"w": 0}, ("width", 0)),
        ({"w": 32767}, ("width", 32767)),
        ({"uid": "é" * 64}, ("uid", "é" * 64)),  # 128 bytes
        ({"p": {}}, ("props", None)),
        ({"p": {"plan": "pro", "n": 2}}, ("props", '{"plan":"pro","n":2}')),
        ({"p": {"k": "v" * 2040}}, ("props", '{"k":"' + "v" * 2040 + '"}')),  # 2,048 bytes
        ({"r": ""}, ("referrer", None)),
        ({"ua": ""}, ("ua", None)),
        ({"t": None, "r": None, "w": None}, ("title", None)),
        ({"ip": "203.0.113.7"}, ("ip_packed", bytes([203, 0, 113, 7]))),
        ({"ip": "::ffff:203.0.113.7"}, ("ip_packed", bytes([203, 0, 113, 7]))),
        ({"ip": "2001:db8:0:0::1"}, ("ip_packed", bytes.fromhex("20010db8" + "0" * 22 + "01"))),
    ],
)
def test_valid_fields_are_cleaned(fields, expected):
    attribute, value = expected
    assert getattr(one(**fields), attribute) == value


@pytest.mark.parametrize(
    ("ts", "stored"),
    [
        (None, NOW),
        (NOW - 3_600_000, NOW - 3_600_000),
        (NOW - 3_600_001, NOW),
        (NOW + 60_000, NOW + 60_000),
        (NOW + 60_001, NOW),
        (0, NOW),
        (-5, NOW),
        (NOW - 1234, NOW - 1234),
    ],
)
def test_ts_outside_the_window_becomes_the_receipt_time(ts, stored):
    assert one(ts=ts).ts == stored


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("a" * 600, 512, "a" * 512),
        ("a" * 511 + "é", 512, "a" * 511),  # é would need bytes 512 and 513
        ("a" * 510 + "é", 512, "a" * 510 + "é"),
        ("€" * 200, 512, "€" * 170),  # 3 bytes each: 510 bytes
        ("😀" * 200, 512, "😀" * 128),
        ("en-US", 35, "en-US"),
        ("de-DE-x-" + "ü" * 40, 35, "de-DE-x-" + "ü" * 13),  # 8 + 26 bytes
    ],
)
def test_truncation_ends_on_a_character_boundary(text, limit, expected):
    assert truncate_utf8(text, limit) == expected
    assert len(truncate_utf8(text, limit).encode()) <= limit


def test_title_and_language_are_truncated_not_refused():
    event = one(t="T" * 5000, l="x" * 100)
    assert event.title == "T" * 512 and event.language == "x" * 35


def batch(*elements, site=SITE, **envelope):
    return {"s": site, "b": list(elements), **envelope}


def element(**fields):
    return {"e": "pageview", "u": "https://example.com/a", **fields}


def test_batch_of_one_to_fifty():
    site, events = parse_events(batch(*[element(e=f"e{i}") for i in range(50)]), NOW)
    assert site == SITE and [e.name for e in events] == [f"e{i}" for i in range(50)]
    assert refused(batch(*[element()] * 51)) == (
        "invalid event input: b: must be a list of 1 to 50 events")
    assert refused(batch()).startswith("invalid event input: b: ")
    assert refused({"s": SITE, "b": {"e": "x"}}).startswith("invalid event input: b: ")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (batch(element(), element(w=-1)), "b[1].w: must be an integer from 0 to 32767"),
        (batch(element(), element(), element(u="nope")), "b[2].u: required, an absolute"),
        (batch(element(zz=1)), "b[0].zz: unknown field"),
        (batch(element(), "x"), "b[1]: must be an object"),
        (batch(element(), element(s="site_other")), "b[1].s: events for different sites"),
        (batch(element(s=5)), "b[0].s: events for different sites"),
        (batch(element(), e="pageview"), "e: unknown field"),
        (batch(element(e="$identify")), "b[0].uid: required for $identify"),
        ({"b": [element()]}, "s: required"),
    ],
)
def test_batch_errors_name_the_element_and_field(body, message):
    assert refused(body).startswith("invalid event input: " + message)


def test_element_may_repeat_the_batch_site():
    site, events = parse_events(batch(element(s=SITE), element()), NOW)
    assert site == SITE and len(events) == 2


def test_first_invalid_field_in_a_fixed_order():
    body = single(e="", u="nope", w=-1, zz=1)
    assert refused(body).startswith("invalid event input: zz: ")
    del body["zz"]
    assert refused(body).startswith("invalid event input: e: ")


def test_queued_events_hold_a_repeated_agent_and_name_once():
    """A full queue of events from a few browsers holds each agent once, not per event
    (docs/perf-notes.md, "Worker memory, fifth round")."""
    agent = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
    bodies = [orjson.loads(orjson.dumps({"s": "site", "b": [
        {"e": "pageview", "u": "https://example.com/", "ip": "203.0.113.7", "ua": agent},
        {"e": "$identify", "u": "https://example.com/", "uid": "u1", "ua": agent}]}))
        for _ in range(2)]
    events = [event for body in bodies for event in parse_events(body, 1_790_000_000_000)[1]]
    assert [event.ua for event in events] == [agent] * 4
    assert len({id(event.ua) for event in events}) == 1
    assert len({id(event.name) for event in events if event.name == "pageview"}) == 1
    assert events[0].ip_packed == bytes([203, 0, 113, 7])


def test_queued_events_hold_a_repeated_page_host_and_referrer_once():
    """Pages, hosts and referrers repeat across a queue as agents do: each is held once
    (docs/perf-notes.md, "Worker memory, sixth round")."""
    bodies = [orjson.loads(orjson.dumps({"s": "site", "b": [
        {"e": "pageview", "u": "https://Example.com./pricing?x=1", "r": "https://www.google.com/"},
        {"e": "pageview", "u": "https://Example.com./pricing?x=1", "r": "https://www.google.com/"}]}))
        for _ in range(2)]
    events = [event for body in bodies for event in parse_events(body, 1_790_000_000_000)[1]]
    assert [(event.url, event.host, event.referrer) for event in events] == [
        ("https://Example.com./pricing?x=1", "example.com", "https://www.google.com/")] * 4
    for field in ("url", "host", "referrer"):
        assert len({id(getattr(event, field)) for event in events}) == 1, field


def test_a_repeated_page_is_checked_once_and_cleaned_the_same(monkeypatch):
    """Valid page URLs are remembered (validation.event._pages): a repeat gets the same
    url, host and path start; refused URLs are not remembered; the memo is bounded in
    entries and in the length of the URLs it keeps."""
    import validation.event as event_module

    pages: dict = {}
    monkeypatch.setattr(event_module, "_pages", pages)
    monkeypatch.setattr(event_module, "PAGE_MEMO_ENTRIES", 3)
    url = "https://Shop.Example.com.:8443/cart?x=1"
    first, again = one(u=url), one(u=url)
    assert (first.url, first.host, first.authority_end) == (url, "shop.example.com", url.index("/cart"))
    assert (again.url, again.host, again.authority_end) == (url, "shop.example.com", url.index("/cart"))
    assert again.url is first.url and url in pages
    assert refused(single(u="https://exa mple.com/")) == (
        "invalid event input: u: required, an absolute http or https URL of at most 2048 bytes")
    assert refused(batch(element(), element(u="nope"))).startswith("invalid event input: b[1].u: ")
    assert "nope" not in pages and "https://exa mple.com/" not in pages
    for n in range(5):
        assert one(u=f"https://example.com/{n}").authority_end == len("https://example.com")
    assert len(pages) <= 3
    long_url = "https://example.com/" + "a" * event_module.PAGE_MEMO_CHARS
    assert one(u=long_url).host == "example.com" and long_url not in pages


def test_a_batch_of_ipv4_and_ipv6_addresses_packs_each_once():
    events = parse_events(batch(element(ip="203.0.113.7"), element(ip="2001:db8::1"),
                                element(ip="::ffff:203.0.113.7")), NOW)[1]
    assert [event.ip_packed for event in events] == [
        bytes([203, 0, 113, 7]), bytes.fromhex("20010db8" + "0" * 23 + "1"), bytes([203, 0, 113, 7])]
    assert refused(batch(element(), element(), element(ip="1.2.3"))).startswith(
        "invalid event input: b[2].ip: must be an IPv4 or IPv6 address")
