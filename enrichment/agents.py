"""User agents: the bot verdict (crawlerdetect's lists) and browser, OS and device (ua-parser).

ua-parser answers browser and OS; the device is only ever tablet, mobile or desktop, told
from the agent's own tokens and the OS, so its table of 633 device expressions (14 MiB a
worker once compiled) is never loaded.

Both are cached per user-agent string: a server sees few distinct agents, and a miss
costs hundreds of microseconds. The caches are bounded; when one is full it starts over.

The caller chooses the text, so both look at its first UA_ANALYSED_CHARS characters
only: a real browser's agent is far shorter, and the bot expressions cost time in
proportion to the length (about 12 us a character; bench/parsers.py measures it). The
cap is also the cache key, so unique endings past it cannot defeat the caches.
"""

from __future__ import annotations

import functools
import re

from crawlerdetect.providers.crawlers import data as CRAWLER_PATTERNS
from crawlerdetect.providers.exclusions import data as EXCLUSION_PATTERNS
from ua_parser import Domain, Parser

from enrichment.memo import Memo

CACHE_ENTRIES = 10_000
UA_ANALYSED_CHARS = 512
DESKTOP, MOBILE, TABLET = "desktop", "mobile", "tablet"
_MOBILE_OS = frozenset({"iOS", "Windows Phone", "BlackBerry OS", "KaiOS", "Firefox OS"})


# A leading "[...]*" lets an alternative start anywhere in a run of those characters, and
# Python's re then tries every start: crawlerdetect's "[a-z0-9\-_]*(bot|crawl|...)" costs
# time quadratic in the length of a run of letters (4 s for 8,000). Whether the
# alternation matches somewhere does not change without it, as "[...]*" may match nothing.
_LEADING_STAR_CLASS = re.compile(r"^\[(?:\\.|[^\]\\])*\]\*")


def _compile(patterns: list[str], linear: bool) -> re.Pattern:
    if linear:
        patterns = [_LEADING_STAR_CLASS.sub("", pattern) for pattern in patterns]
    return re.compile("(" + "|".join(patterns) + ")", re.IGNORECASE)


@functools.cache
def _expressions() -> tuple[re.Pattern, re.Pattern]:
    """(crawlers, exclusions), compiled on first use (about 150 ms), not at import."""
    # Exclusions go through sub(), where what an alternative removes matters: kept as is.
    return _compile(CRAWLER_PATTERNS, linear=True), _compile(EXCLUSION_PATTERNS, linear=False)


def looks_automated(ua: str) -> bool:
    """crawlerdetect's CrawlerDetect().is_crawler(ua), in time linear in the length."""
    ua = ua.strip()
    if not ua:
        return False
    crawlers, exclusions = _expressions()
    agent = exclusions.sub("", ua)
    return bool(agent) and crawlers.search(agent) is not None


class BotFilter:
    """Does a user agent look automated (crawler, headless browser, HTTP library, CLI)?"""

    def __init__(self, max_entries: int = CACHE_ENTRIES):
        self._verdicts = Memo(looks_automated, max_entries)

    def is_bot(self, ua: str) -> bool:
        return self._verdicts[ua[:UA_ANALYSED_CHARS]]


class AgentParser:
    """(browser family, OS family, device type) of a user agent; None where unknown."""

    def __init__(self, max_entries: int = CACHE_ENTRIES):
        self._parsed = Memo(describe_agent, max_entries)

    def describe(self, ua: str) -> tuple[str | None, str | None, str]:
        return self._parsed[ua[:UA_ANALYSED_CHARS]]


@functools.cache
def _browser_and_os() -> Parser:
    """ua-parser with its browser and OS expressions only (built on first use)."""
    from ua_parser.loaders import load_builtins
    from ua_parser.regex import Resolver

    browsers, systems, _devices = load_builtins()
    return Parser(Resolver((browsers, systems, [])))


_BROWSER_AND_OS = Domain.USER_AGENT | Domain.OS
# The tablets ua-parser's device table names from tokens other than "iPad" and "Tablet":
# Puffin's tablet builds (iOS "IT", Android "AT").
_PUFFIN_TABLET = re.compile(r"Puffin/[\d.]+[AI]T")


def describe_agent(ua: str) -> tuple[str | None, str | None, str]:
    result = _browser_and_os()(ua, _BROWSER_AND_OS)
    browser = result.user_agent.family if result.user_agent else None
    os_family = result.os.family if result.os else None
    return _known(browser), _known(os_family), device_type(ua, os_family)


def device_type(ua: str, os_family: str | None) -> str:
    """Tablet, mobile or desktop: the agent's tablet tokens and its OS, plus the `Mobi`
    token rule browsers follow (an Android agent without "Mobile" is a tablet)."""
    if "Tablet" in ua or "iPad" in ua or ("Puffin/" in ua and _PUFFIN_TABLET.search(ua)):
        return TABLET
    if "Mobi" in ua or os_family in _MOBILE_OS:
        return MOBILE
    if os_family == "Android":
        return TABLET
    return DESKTOP


def _known(family: str | None) -> str | None:
    return None if family in (None, "", "Other") else family


def warm_up() -> None:
    """Compile the detectors' expressions now rather than in a request (~150 ms)."""
    looks_automated("Mozilla/5.0 (warm-up)")
    describe_agent("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")
