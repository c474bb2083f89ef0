"""User agents: the bot verdict (crawlerdetect) and browser, OS and device (ua-parser).

Both are cached per user-agent string: a server sees few distinct agents, and a miss
costs hundreds of microseconds. The caches are bounded; when one is full it starts over.
"""

from __future__ import annotations

import ua_parser
from crawlerdetect import CrawlerDetect
from ua_parser import Domain

from enrichment.memo import Memo

CACHE_ENTRIES = 10_000
DESKTOP, MOBILE, TABLET = "desktop", "mobile", "tablet"
_MOBILE_OS = frozenset({"iOS", "Windows Phone", "BlackBerry OS", "KaiOS", "Firefox OS"})


class BotFilter:
    """Does a user agent look automated (crawler, headless browser, HTTP library, CLI)?"""

    def __init__(self, max_entries: int = CACHE_ENTRIES):
        self._verdicts = Memo(CrawlerDetect().is_crawler, max_entries)

    def is_bot(self, ua: str) -> bool:
        return self._verdicts[ua]


class AgentParser:
    """(browser family, OS family, device type) of a user agent; None where unknown."""

    def __init__(self, max_entries: int = CACHE_ENTRIES):
        self._parsed = Memo(describe_agent, max_entries)

    def describe(self, ua: str) -> tuple[str | None, str | None, str]:
        return self._parsed[ua]


def describe_agent(ua: str) -> tuple[str | None, str | None, str]:
    result = ua_parser.parser(ua, Domain.ALL)
    browser = result.user_agent.family if result.user_agent else None
    os_family = result.os.family if result.os else None
    device = result.device.family if result.device else ""
    return _known(browser), _known(os_family), device_type(ua, os_family, device)


def device_type(ua: str, os_family: str | None, device_family: str) -> str:
    """Tablet, mobile or desktop: ua-parser's device and OS, plus the `Mobi` token rule
    browsers follow (an Android agent without "Mobile" is a tablet)."""
    if device_family == "iPad" or "Tablet" in device_family or "Tablet" in ua or "iPad" in ua:
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
    CrawlerDetect().is_crawler("Mozilla/5.0 (warm-up)")
    describe_agent("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")
