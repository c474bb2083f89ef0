"""The client library's pure parts: the web helpers, back-off, and what is refused when
queued (no server needed: nothing here is sent)."""

from __future__ import annotations

import pytest
from tally_client import Tally, client_ip, visitor_id_from_cookies
from tally_client.client import MAX_BATCH, MAX_BODY_BYTES

UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
PROXIES = ("127.0.0.0/8", "::1/128", "10.0.0.0/8")


@pytest.mark.parametrize("peer, forwarded, expected", [
    ("203.0.113.7", None, "203.0.113.7"),                       # direct visitor
    ("203.0.113.7", "1.2.3.4", "203.0.113.7"),                  # untrusted peer: header ignored
    ("127.0.0.1", "198.51.100.9", "198.51.100.9"),              # one trusted proxy
    ("127.0.0.1", "6.6.6.6, 198.51.100.9", "198.51.100.9"),     # a forged left part is ignored
    ("10.1.2.3", "198.51.100.9, 10.0.0.5", "198.51.100.9"),     # two trusted hops
    ("127.0.0.1", "10.0.0.5, 10.0.0.6", "10.0.0.5"),            # all trusted: the left-most
    ("127.0.0.1", None, "127.0.0.1"),                           # a local call
    ("127.0.0.1", "not-an-ip", "127.0.0.1"),                    # garbage stops the walk
    ("::ffff:127.0.0.1", "198.51.100.9", "198.51.100.9"),       # IPv4-mapped peer
    ("::1", "2001:db8::1", "2001:db8::1"),
    ("127.0.0.1", "[2001:db8::2]", "2001:db8::2"),
    ("", None, None),
])
def test_client_ip_trusts_only_listed_proxies(peer, forwarded, expected):
    environ = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        environ["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_ip(environ, PROXIES) == expected


def test_client_ip_reads_framework_requests():
    class Flask:
        environ = {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "198.51.100.9"}

    class Django:
        META = {"REMOTE_ADDR": "203.0.113.7"}

    class Starlette:
        scope = {"client": ("127.0.0.1", 5000),
                 "headers": [(b"x-forwarded-for", b"198.51.100.10")]}

    assert client_ip(Flask()) == "198.51.100.9"
    assert client_ip(Django()) == "203.0.113.7"
    assert client_ip(Starlette()) == "198.51.100.10"
    assert client_ip(Flask(), trusted_proxies=()) == "127.0.0.1"
    with pytest.raises(TypeError):
        client_ip(object())


@pytest.mark.parametrize("source, expected", [
    ({"tally_vid": "Yq3v0aZ-kX_9lM2p"}, "Yq3v0aZ-kX_9lM2p"),
    ("theme=dark; tally_vid=Yq3v0aZ-kX_9lM2p; x=1", "Yq3v0aZ-kX_9lM2p"),
    ({"HTTP_COOKIE": "tally_vid=Yq3v0aZ-kX_9lM2p", "REMOTE_ADDR": "1.2.3.4"},
     "Yq3v0aZ-kX_9lM2p"),
    ({"tally_vid": "short"}, None),
    ({"tally_vid": "<script>alert(1)</script>"}, None),
    ("tally_vid=" + "a" * 65, None),
    ("", None),
    ({}, None),
])
def test_visitor_id_from_cookies(source, expected):
    assert visitor_id_from_cookies(source) == expected


def test_visitor_id_from_request_objects():
    class Flask:
        cookies = {"tally_vid": "Yq3v0aZ-kX_9lM2p"}

    class Falcon:
        env = {"HTTP_COOKIE": "tally_vid=Yq3v0aZ-kX_9lM2p"}

    assert visitor_id_from_cookies(Flask()) == "Yq3v0aZ-kX_9lM2p"
    assert visitor_id_from_cookies(Falcon()) == "Yq3v0aZ-kX_9lM2p"


def offline(**kwargs) -> Tally:
    # Port 9 (discard) on loopback: nothing is sent in these tests anyway.
    return Tally("http://127.0.0.1:9", "tly_x", "site_x", flush_interval=3600, **kwargs)


def test_backoff_starts_from_retry_after_and_doubles_with_jitter_up_to_the_cap():
    client = offline(backoff_cap=30.0, jitter=lambda: 1.0)
    waits, wait = [], None
    for _ in range(7):
        wait = client._backoff(wait, None)
        waits.append(wait)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert client._backoff(None, 2.0) == 2.0
    low = offline(jitter=lambda: 0.0)
    assert low._backoff(8.0, None) == 8.0  # half of the doubled 16
    assert low._backoff(8.0, 12.0) == 12.0  # never sooner than Retry-After


def test_a_full_queue_refuses_at_once_and_counts():
    client = offline(max_queue=5)
    accepted = [client.pageview("https://shop.example/", ip="1.2.3.4", ua=UA) for _ in range(8)]
    assert accepted == [True] * 5 + [False] * 3
    assert client.stats["dropped_queue_full"] == 3
    client._queue.clear()


def test_events_too_large_alone_are_refused_with_the_servers_messages():
    errors = []
    client = offline(on_error=lambda error, batch: errors.append((error, batch)))
    assert not client.event("big", "https://shop.example/", props={"x": "y" * 3000})
    assert not client.event("big", "https://shop.example/" + "a" * 2100)
    assert not client.event("big", "https://shop.example/", title="t" * 8200)
    assert [e.message for e, _ in errors] == [
        "invalid event input: p: must be a JSON object of at most 2048 bytes",
        "invalid event input: u: required, an absolute http or https URL of at most 2048 bytes",
        "request body is larger than 8192 bytes",
    ]
    assert {e.code for e, _ in errors} == {"invalid_input"}
    assert client.stats["failed"] == 3 and not client._queue


def test_batches_respect_50_events_and_8_kib():
    client = offline()
    for n in range(120):
        client.event("e", "https://shop.example/", props={"pad": "x" * 300, "n": n})
    sizes = []
    while client._queue:
        batch = client._take_batch()
        body = client._body_prefix + b",".join(encoded for _, encoded in batch) + b"]}"
        assert len(body) <= MAX_BODY_BYTES and len(batch) <= MAX_BATCH
        sizes.append(len(batch))
    assert sum(sizes) == 120 and max(sizes) < MAX_BATCH  # the byte limit split them
    small = offline()
    for _ in range(120):
        small.event("e", "https://shop.example/")
    assert len(small._take_batch()) == MAX_BATCH
    small._queue.clear()


def test_events_are_stamped_when_queued():
    client = offline(clock=lambda: 1_790_000_000.5)
    client.pageview("https://shop.example/")
    event, _ = client._queue.popleft()
    assert event["ts"] == 1_790_000_000_500
