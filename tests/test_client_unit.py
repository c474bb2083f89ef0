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
    ({"tally_vid": "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}, "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"),
    ("theme=dark; tally_vid=5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f; x=1", "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"),
    ({"HTTP_COOKIE": "tally_vid=5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f", "REMOTE_ADDR": "1.2.3.4"},
     "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"),
    ({"tally_vid": "50ed.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}, "50ed.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"),
    ("x=1; tally_vid=50ed.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f", "50ed.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"),
    ({"tally_vid": "short"}, None),
    ({"tally_vid": "50ED.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}, None),
    ({"tally_vid": "50ed5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}, None),
    ({"tally_vid": "5F0C3A9E1B7D4C2A8E6F0B1D3C5A7E9F"}, None),  # the script writes lower case
    ({"tally_vid": "<script>alert(1)</script>"}, None),
    ("tally_vid=" + "a" * 33, None),
    ("", None),
    ({}, None),
])
def test_visitor_id_from_cookies(source, expected):
    assert visitor_id_from_cookies(source) == expected


def test_visitor_id_from_request_objects():
    class Flask:
        cookies = {"tally_vid": "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}

    class Falcon:
        env = {"HTTP_COOKIE": "tally_vid=5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"}

    assert visitor_id_from_cookies(Flask()) == "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"
    assert visitor_id_from_cookies(Falcon()) == "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f"


def offline(**kwargs) -> Tally:
    """A client whose sender never starts: these tests look at its queue, and send nothing."""
    client = Tally("http://127.0.0.1:9", "tly_x", "site_x", flush_interval=3600, **kwargs)
    client._ensure_sender = lambda: None
    return client


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


@pytest.mark.parametrize("value", ["5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f", "5F0C3A9E1B7D4C2A8E6F0B1D3C5A7E9F",
                                   "5f0c3a9e", "0" * 32, "g" * 32, "12345678901234567890",
                                   "5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f0",
                                   "50ed.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f", "ffff." + "0" * 32,
                                   "50e.5f0c3a9e1b7d4c2a8e6f0b1d3c5a7e9f", "50ed:" + "0" * 32,
                                   "50ed." + "0" * 31, "50eD." + "0" * 32, "0" * 32 + ".50ed"])
def test_the_cookie_helper_accepts_exactly_the_ids_the_server_accepts(value):
    from storage.browser_ids import is_browser_id

    assert (visitor_id_from_cookies({"tally_vid": value}) is not None) == is_browser_id(value)
