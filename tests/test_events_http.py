"""POST /api/v1/events over WSGI: statuses, codes and messages in the issue's order, bots,
what is stored, and the bounded queue."""

from __future__ import annotations

import io

import orjson
import pytest
import webtest

from app import create_app
from tests.conftest import WAIT, WriteLock, bearer, config_for, database_dump, rows, wait_until
from tests.test_http_foundation import assert_envelope

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 "
          "(KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1")


def post(client, key: str | None, body, *, raw: bytes | None = None, headers: dict | None = None):
    data = raw if raw is not None else orjson.dumps(body)
    all_headers = {**(bearer(key) if key else {}), **(headers or {})}
    return client.post("/api/v1/events", data, headers=all_headers,
                       content_type="application/json", expect_errors=True)


def pageview(site_id: str, **fields) -> dict:
    return {"s": site_id, "e": "pageview", "u": "https://example.com/pricing", **fields}


def events(db_path: str) -> list[dict]:
    return rows(db_path, "SELECT * FROM events ORDER BY id")


def stored_names(db_path: str) -> list[str]:
    return [r["name"] for r in events(db_path)]


def flush(tally) -> None:
    assert tally.flusher.flush_now(timeout=WAIT)


# Order of checks -----------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer tly_" + "A" * 43])
def test_bad_key_is_401_before_anything_else(client, site, header):
    resp = client.post("/api/v1/events", b"{not json", content_type="application/json",
                       headers={"Authorization": header} if header else {}, expect_errors=True)
    assert_envelope(resp, 401, "unauthorized")


def test_revoked_key_is_401(client, site, directory, clock):
    directory.revoke_key(site["key_id"])
    clock.advance(1.01)
    assert_envelope(post(client, site["key"], pageview(site["site"]["id"])), 401, "unauthorized")


def test_key_without_events_scope_is_403(client, site, directory):
    key = directory.create_key(site["site"]["id"], ["payments", "read"])
    resp = post(client, key["key"], pageview(site["site"]["id"]))
    error = assert_envelope(resp, 403, "forbidden")
    assert "events" in error["message"]


def test_size_is_checked_before_json(client, site):
    resp = post(client, site["key"], None, raw=b"{" * 8193)
    error = assert_envelope(resp, 413, "invalid_input")
    assert "8192" in error["message"]


def body_of_exactly(site_id: str, size: int) -> bytes:
    base = orjson.dumps(pageview(site_id, t=""))
    padded = orjson.dumps(pageview(site_id, t="x" * (size - len(base))))
    assert len(padded) == size
    return padded


def test_8192_bytes_accepted_8193_refused(client, site, tally, db_path):
    site_id = site["site"]["id"]
    assert post(client, site["key"], None, raw=body_of_exactly(site_id, 8192)).status_int == 204
    resp = post(client, site["key"], None, raw=body_of_exactly(site_id, 8193))
    assert_envelope(resp, 413, "invalid_input")
    flush(tally)
    assert [r["title"] for r in events(db_path)] == ["x" * 512]


def test_body_without_content_length_is_never_read_past_the_limit(tally, site):
    class Endless(io.RawIOBase):
        read_bytes = 0

        def readable(self):
            return True

        def readinto(self, buffer):
            buffer[:] = b" " * len(buffer)
            self.read_bytes += len(buffer)
            return len(buffer)

    stream = Endless()
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/events", "SERVER_NAME": "t",
        "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
        "wsgi.input": io.BufferedReader(stream), "wsgi.errors": io.StringIO(),
        "CONTENT_TYPE": "application/json", "HTTP_AUTHORIZATION": f"Bearer {site['key']}",
        "HTTP_TRANSFER_ENCODING": "chunked",
    }
    statuses = []
    body = b"".join(tally(environ, lambda status, headers: statuses.append(status)))
    assert statuses[0].startswith("413")
    assert orjson.loads(body)["error"]["code"] == "invalid_input"
    assert stream.read_bytes < 64 * 1024


@pytest.mark.parametrize(
    ("raw", "starts"),
    [
        (b"", "invalid JSON: "),
        (b"{\"s\": ", "invalid JSON: "),
        (b"[1, 2]", "invalid event input: body: must be a JSON object"),
        (b"{\"s\": \"x\", \"e\": \"pageview\", \"u\": \"https://example.com/\", \"x\": 1}",
         "invalid event input: x: unknown field"),
    ],
)
def test_malformed_json_and_unknown_fields_are_400(client, site, raw, starts):
    error = assert_envelope(post(client, site["key"], None, raw=raw), 400, "invalid_input")
    assert error["message"].startswith(starts)


def test_invalid_field_is_400_even_for_an_unknown_site(client, site):
    # Step 3 (fields) comes before step 4 (site).
    resp = post(client, site["key"], pageview("site_unknown", w=-3))
    error = assert_envelope(resp, 400, "invalid_input")
    assert error["message"] == "invalid event input: w: must be an integer from 0 to 32767"


def test_batch_error_names_index_and_field(client, site):
    site_id = site["site"]["id"]
    body = {"s": site_id, "b": [{"e": "a", "u": "https://example.com/"},
                                {"e": "b", "u": "https://example.com/", "p": [1]}]}
    error = assert_envelope(post(client, site["key"], body), 400, "invalid_input")
    assert error["message"].startswith("invalid event input: b[1].p: ")


def test_more_than_fifty_events_is_400(client, site):
    body = {"s": site["site"]["id"], "b": [{"e": "a", "u": "https://example.com/"}] * 51}
    error = assert_envelope(post(client, site["key"], body), 400, "invalid_input")
    assert error["message"] == "invalid event input: b: must be a list of 1 to 50 events"


def test_batch_naming_two_sites_is_400(client, site):
    site_id = site["site"]["id"]
    body = {"s": site_id, "b": [{"e": "a", "u": "https://example.com/", "s": site_id},
                                {"e": "b", "u": "https://example.com/", "s": "site_other"}]}
    error = assert_envelope(post(client, site["key"], body), 400, "invalid_input")
    assert error["message"].startswith("invalid event input: b[1].s: ")


def test_unknown_site_is_404(client, site):
    assert_envelope(post(client, site["key"], pageview("site_nope")), 404, "not_found")


def test_another_accounts_site_is_403(client, site, directory):
    other = directory.create_account("Other")
    other_site = directory.create_site(other["id"], ["example.com"])
    resp = post(client, site["key"], pageview(other_site["id"]))
    assert_envelope(resp, 403, "forbidden")


@pytest.mark.parametrize(
    "url",
    ["https://EXAMPLE.com/a", "http://example.com:8443/a", "https://www.example.com",
     "https://example.com./a?x=1", "https://user@example.com/"],
)
def test_host_match_ignores_case_and_port(client, site, url):
    assert post(client, site["key"], pageview(site["site"]["id"], u=url)).status_int == 204


@pytest.mark.parametrize(
    "url", ["https://evil.test/a", "https://sub.example.com/", "https://example.com.evil.test/"]
)
def test_host_not_on_the_site_is_400(client, site, url):
    error = assert_envelope(post(client, site["key"], pageview(site["site"]["id"], u=url)),
                            400, "invalid_input")
    assert error["message"].startswith("invalid event input: u: host ")
    body = {"s": site["site"]["id"], "b": [{"e": "a", "u": "https://example.com/"},
                                           {"e": "b", "u": url}]}
    error = assert_envelope(post(client, site["key"], body), 400, "invalid_input")
    assert error["message"].startswith("invalid event input: b[1].u: host ")


# Bots ------------------------------------------------------------------------------

BOT_AGENTS = [
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "HeadlessChrome/120.0.0.0 Safari/537.36",
    "curl/8.5.0",
    "python-requests/2.31.0",
    "Wget/1.21.4",
    "Go-http-client/1.1",
    "okhttp/4.12.0",
]


def test_bots_are_dropped_silently(client, site, tally, db_path):
    site_id = site["site"]["id"]
    for ua in BOT_AGENTS:
        assert post(client, site["key"], pageview(site_id, e="bot", ua=ua)).status_int == 204
    batch = {"s": site_id, "b": [{"e": "bot", "u": "https://example.com/", "ua": ua}
                                 for ua in BOT_AGENTS]
             + [{"e": "human", "u": "https://example.com/", "ua": FIREFOX},
                {"e": "no-agent", "u": "https://example.com/"}]}
    assert post(client, site["key"], batch).status_int == 204
    flush(tally)
    assert stored_names(db_path) == ["human", "no-agent"]
    assert rows(db_path, "SELECT events FROM monthly_usage") == [{"events": 2}]


# What is stored ------------------------------------------------------------------


def test_single_event_is_stored_with_its_enrichment(client, site, tally, db_path, clock):
    site_id = site["site"]["id"]
    body = pageview(
        site_id, u="https://www.example.com/pricing/?utm_source=news&utm_medium=email"
        "&utm_campaign=spring&utm_term=tool&utm_content=hero&gclid=G1&fbclid=F1#plans",
        r="https://www.google.co.uk/search?q=tally", t="Pricing", w=1440, l="en-GB",
        p={"plan": "pro"}, ts=int(clock() * 1000) - 5_000, ip="81.2.69.142", ua=IPHONE,
    )
    resp = post(client, site["key"], body)
    assert resp.status_int == 204 and resp.body == b""
    flush(tally)
    [row] = events(db_path)
    visitor = row.pop("visitor_id")
    assert isinstance(visitor, int) and -(2**63) <= visitor < 2**63
    row.pop("session_id")  # the attribution step's (issue 6)
    assert row == {
        "id": 1, "site_id": row["site_id"], "ts": int(clock() * 1000) - 5_000, "name": "pageview",
        "pathname": "/pricing/", "url": body["u"], "hostname": "www.example.com",
        "referrer": body["r"], "referrer_host": "www.google.co.uk", "title": "Pricing",
        "width": 1440, "language": "en-GB", "uid": None, "props": '{"plan":"pro"}',
        "country": "GB", "browser": "Mobile Safari", "os": "iOS", "device": "mobile",
        "utm_source": "news", "utm_medium": "email", "utm_campaign": "spring",
        "utm_term": "tool", "utm_content": "hero", "gclid": "G1", "gbraid": None,
        "wbraid": None, "msclkid": None, "fbclid": "F1", "anonymous": None,
    }


def test_event_without_ip_or_ua_is_stored_without_visitor(client, site, tally, db_path):
    site_id = site["site"]["id"]
    post(client, site["key"], pageview(site_id, e="bare"))
    post(client, site["key"], pageview(site_id, e="ua-only", ua=FIREFOX))
    post(client, site["key"], pageview(site_id, e="ip-only", ip="8.8.8.8"))
    flush(tally)
    found = {r["name"]: r for r in events(db_path)}
    assert [found[n]["visitor_id"] for n in ("bare", "ua-only", "ip-only")] == [None] * 3
    assert found["ua-only"]["browser"] == "Firefox" and found["ua-only"]["country"] is None
    assert found["ip-only"]["country"] == "US" and found["ip-only"]["browser"] is None


def test_identify_is_stored_with_uid(client, site, tally, db_path):
    body = pageview(site["site"]["id"], e="$identify", uid="user-42", ip="81.2.69.142", ua=FIREFOX)
    assert post(client, site["key"], body).status_int == 204
    flush(tally)
    [row] = events(db_path)
    assert (row["name"], row["uid"]) == ("$identify", "user-42")


def test_raw_ip_is_never_stored(client, site, tally, db_path):
    post(client, site["key"], pageview(site["site"]["id"], ip="198.51.100.77", ua=FIREFOX))
    flush(tally)
    tally.stop(timeout=5)
    dump = database_dump(db_path)
    assert "pageview" in dump
    assert "198.51.100.77" not in dump
    assert bytes([198, 51, 100, 77]).hex() not in dump.lower()


def test_batch_is_stored_in_order(client, site, tally, db_path):
    body = {"s": site["site"]["id"],
            "b": [{"e": f"step {i}", "u": f"https://example.com/{i}"} for i in range(50)]}
    assert post(client, site["key"], body).status_int == 204
    flush(tally)
    assert stored_names(db_path) == [f"step {i}" for i in range(50)]
    assert [r["pathname"] for r in events(db_path)][:3] == ["/0", "/1", "/2"]


# The bounded queue -----------------------------------------------------------------


@pytest.fixture
def small_queue(db_path, clock):
    app = create_app(config_for(db_path, queue_max=60, flush_interval=3600), clock=clock)
    app.flusher.busy_timeout_ms = 20
    app.flusher.backoff = (0.02, 0.1)
    yield app
    app.stop(timeout=5)


def batch_of(site_id: str, count: int, name: str) -> dict:
    return {"s": site_id, "b": [{"e": name, "u": "https://example.com/"}] * count}


@pytest.fixture
def queued(small_queue):
    """(client, site id, events key) of a new site on the small queue's app."""
    directory = small_queue.directory
    account = directory.create_account("Q", "scale")
    site_id = directory.create_site(account["id"], ["example.com"])["id"]
    key = directory.create_key(site_id, ["events"])["key"]
    return webtest.TestApp(small_queue), site_id, key


def test_queue_full_is_503_and_takes_nothing_of_the_request(small_queue, queued, db_path):
    client, site_id, key = queued

    blocker = WriteLock(db_path)  # the database is locked: nothing can be stored
    try:
        assert post(client, key, batch_of(site_id, 50, "first")).status_int == 204
        assert not small_queue.flusher.flush_now(timeout=0.2)
        assert wait_until(lambda: small_queue.flusher.failures >= 1)
        resp = post(client, key, batch_of(site_id, 11, "refused"))
        assert_envelope(resp, 503, "rate_limited")
        assert resp.headers["Retry-After"] == "2"
        assert post(client, key, batch_of(site_id, 10, "last")).status_int == 204
        assert_envelope(post(client, key, pageview(site_id, e="one more")), 503, "rate_limited")
    finally:
        blocker.release()
    assert small_queue.flusher.flush_now(timeout=WAIT)
    names = stored_names(db_path)
    assert names.count("first") == 50 and names.count("last") == 10 and len(names) == 60
    assert rows(db_path, "SELECT events FROM monthly_usage") == [{"events": 60}]
    # Room again once stored.
    assert post(client, key, batch_of(site_id, 50, "again")).status_int == 204


def test_a_batch_the_queue_cannot_take_is_refused_before_it_is_parsed(small_queue, queued, db_path):
    client, site_id, key = queued
    blocker = WriteLock(db_path)
    try:
        assert post(client, key, batch_of(site_id, 50, "first")).status_int == 204
        # Room for 10 events: a body of 11 events is refused whole, and so early that
        # its broken last event is never read (room, not validity, answers).
        broken = orjson.dumps(batch_of(site_id, 11, "refused"))[:-3] + b"]}"
        resp = post(client, key, None, raw=broken)
        assert_envelope(resp, 503, "rate_limited")
        assert resp.headers["Retry-After"] == "2"
        # With room, the same kind of body is parsed and answered for what it is.
        shorter = orjson.dumps(batch_of(site_id, 9, "x"))[:-3] + b"]}"
        assert_envelope(post(client, key, None, raw=shorter), 400, "invalid_input")
        assert post(client, key, batch_of(site_id, 10, "last")).status_int == 204
        assert_envelope(post(client, key, None, raw=b'{"u"'), 503, "rate_limited")
    finally:
        blocker.release()
    assert small_queue.flusher.flush_now(timeout=WAIT)
    names = stored_names(db_path)
    assert names.count("first") == 50 and names.count("last") == 10 and len(names) == 60
    small_queue.stop(timeout=5)
    restarted = create_app(config_for(db_path, queue_max=60))  # a restart on the data written
    try:
        client = webtest.TestApp(restarted)
        assert post(client, key, batch_of(site_id, 50, "after")).status_int == 204
        assert restarted.flusher.flush_now(timeout=WAIT)
        assert len(stored_names(db_path)) == 110
    finally:
        restarted.stop(timeout=5)


def test_every_field_of_a_single_event_is_stored_as_sent(small_queue, queued, db_path):
    """What the request path queues (the validator's fields, the unit built without its
    NamedTuple's __new__) is stored as sent, and read back so after a restart."""
    client, site_id, key = queued
    sent = pageview(site_id, u="https://example.com/pricing?utm_source=news", e="Signup",
                    r="https://www.google.com/", t="Pricing", w=1280, l="en-US",
                    uid="user-7", p={"plan": "pro"}, ip="2001:db8::1", ua=FIREFOX)
    assert post(client, key, sent).status_int == 204
    assert small_queue.flusher.flush_now(timeout=WAIT)
    small_queue.stop(timeout=5)
    restarted = create_app(config_for(db_path, queue_max=60))  # a restart on the data written
    try:
        client = webtest.TestApp(restarted)
        assert post(client, key, pageview(site_id, e="after")).status_int == 204
        assert restarted.flusher.flush_now(timeout=WAIT)
    finally:
        restarted.stop(timeout=5)
    first, after = events(db_path)
    assert {name: first[name] for name in ("name", "pathname", "url", "hostname", "referrer",
                                           "title", "width", "language", "uid", "props",
                                           "browser", "utm_source")} == {
        "name": "Signup", "pathname": "/pricing",
        "url": "https://example.com/pricing?utm_source=news", "hostname": "example.com",
        "referrer": "https://www.google.com/", "title": "Pricing", "width": 1280,
        "language": "en-US", "uid": "user-7", "props": '{"plan":"pro"}',
        "browser": "Firefox", "utm_source": "news"}
    assert after["name"] == "after"


def test_nothing_is_lost_while_the_database_is_locked(small_queue, queued, db_path):
    client, site_id, key = queued
    assert post(client, key, pageview(site_id, e="before")).status_int == 204
    assert small_queue.flusher.flush_now(timeout=WAIT)

    blocker = WriteLock(db_path)
    try:
        accepted = 0
        for i in range(40):
            if post(client, key, pageview(site_id, e=f"locked {i}")).status_int == 204:
                accepted += 1
            if i % 10 == 0:
                small_queue.flusher.flush_now(timeout=0.05)
        assert wait_until(lambda: small_queue.flusher.failures >= 3)
    finally:
        blocker.release()
    assert accepted == 40
    assert small_queue.flusher.flush_now(timeout=WAIT)
    assert stored_names(db_path) == ["before"] + [f"locked {i}" for i in range(40)]


def test_an_overlong_site_id_is_404_without_a_cache_entry(client, site, tally):
    resp = post(client, site["key"], pageview("site_" + "x" * 5000))
    assert_envelope(resp, 404, "not_found")
    assert len(resp.json["error"]["message"]) < 100
    assert all(len(key) <= 64 for key in tally.events.sites._entries)
