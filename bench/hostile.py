"""Hostile inputs and clients: what the worst caller-chosen text costs, and whether
/healthz keeps answering while idle and slow clients hold connections.

`parsers()` runs in this process (no server): for each parser that sees caller text, the
worst input found, its cost per call and per 8 KiB request. `slow_clients(url)` holds
IDLE_CONNECTIONS connections that send nothing and SLOW_BODIES that send headers and the
start of a body, then times /healthz; run against the default deployment.
"""

from __future__ import annotations

import itertools
import socket
import statistics
import time
import urllib.parse
from collections.abc import Callable

IDLE_CONNECTIONS = 200
SLOW_BODIES = 20
HEALTH_PROBES = 20

_unique = itertools.count()


def _cost_ms(fn: Callable[[], object], runs: int) -> float:
    started = time.process_time()
    for _ in range(runs):
        fn()
    return round((time.process_time() - started) / runs * 1000, 3)


def parsers() -> dict:
    from crawlerdetect import CrawlerDetect

    from enrichment.agents import UA_ANALYSED_CHARS, BotFilter, describe_agent, warm_up
    from enrichment.urls import campaign, url_host
    from validation.event import parse_events

    warm_up()
    bots = BotFilter()

    def unique_ua(base: str, length: int) -> str:
        # Unique within the analysed prefix, so no cache helps.
        return str(next(_unique)) + (base * length)[:length]

    cases = []

    def case(name: str, fn: Callable[[], object], runs: int, per_request: int, note: str = ""):
        ms = _cost_ms(fn, runs)
        cases.append({"name": name, "ms_per_call": ms, "calls_per_request": per_request,
                      "ms_per_request": round(ms * per_request, 2), "note": note})

    # An 8 KiB body holds at most about 13 events with a 512-character agent.
    # "Mozilla/5.0 " then letters: an exclusion to remove, then text re's removal tries at
    # every position (the bot filter's slowest input found).
    for lead, base in (("", "a"), ("", "a "), ("", "/"), ("", "Mozilla/5.0 (X11; Linux x86_64) "),
                       ("Mozilla/5.0 ", "a")):
        case(f"bot filter, unique {len(lead + unique_ua(base, 8000))}-char ua of "
             f"{lead!r} + {base!r}...",
             lambda lead=lead, base=base: bots.is_bot(lead + unique_ua(base, 8000)), 20, 13,
             f"analyses the first {UA_ANALYSED_CHARS} characters")
    case("crawlerdetect as shipped, unique 2,048-char ua of 'a' (before the cap)",
         lambda: CrawlerDetect().is_crawler(unique_ua("a", 2048)), 2, 3,
         "quadratic; 8,000 characters cost seconds")
    case("ua-parser, unique 512-char ua of '/'", lambda: describe_agent(unique_ua("/", 511)),
         50, 13)
    query = "https://example.com/?" + "&" * 2000 + "utm_source=x"
    case("campaign query of 2,000 '&'", lambda: campaign(query + str(next(_unique))), 50, 3)
    referrer = "http://" + "a" * 2000 + " x"
    case("referrer host of 2,000 letters and a space", lambda: url_host(referrer), 200, 3)
    url = "http://" + "a" * 2000 + " x"
    body = {"s": "site", "b": [{"e": "pageview", "u": url}]}
    case("event validation, 2,000-letter host with a space",
         lambda: _refused(parse_events, body), 200, 3)
    case("urllib.parse.urlsplit of a 2,048-byte URL",
         lambda: urllib.parse.urlsplit(query), 200, 3)
    worst = max(cases, key=lambda c: c["ms_per_request"] if "before" not in c["name"] else 0)
    return {"cases": cases, "worst_ms_per_request": worst["ms_per_request"],
            "worst": worst["name"]}


def _refused(parse, body):
    try:
        parse(body, 0)
    except ValueError:
        pass


def slow_clients(url: str) -> dict:
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    held = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            held.append(socket.create_connection((host, port), timeout=10))
        for _ in range(SLOW_BODIES):
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(b"POST /api/v1/events HTTP/1.1\r\nHost: bench\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"s\":")
            held.append(sock)
        time.sleep(0.5)
        seconds, statuses = [], []
        for _ in range(HEALTH_PROBES):
            started = time.perf_counter()
            statuses.append(_health(host, port))
            seconds.append(time.perf_counter() - started)
            time.sleep(0.1)
    finally:
        for sock in held:
            sock.close()
    ok = sum(1 for status in statuses if status == 200)
    return {"idle_connections": IDLE_CONNECTIONS, "slow_bodies": SLOW_BODIES,
            "probes": HEALTH_PROBES, "answered_200": ok,
            "median_ms": round(statistics.median(seconds) * 1000, 1),
            "max_ms": round(max(seconds) * 1000, 1)}


def _health(host: str, port: int) -> int | str:
    try:
        with socket.create_connection((host, port), timeout=40) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            head = sock.recv(64)
        return int(head.split(b" ")[1])
    except (OSError, IndexError, ValueError) as exc:
        return type(exc).__name__
