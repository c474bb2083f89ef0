"""User agents: the bot verdict (crawlerdetect's lists) and browser, OS and device (ua-parser).

ua-parser's expressions answer browser and OS; the device is only ever tablet, mobile or desktop, told
from the agent's own tokens and the OS, so its table of 633 device expressions (14 MiB a
worker once compiled) is never loaded.

Both are cached per user-agent string: a server sees few distinct agents, and a miss
costs hundreds of microseconds. The caches are bounded; when one is full it starts over.

The bot verdict runs crawlerdetect's 1,462 expressions as one RE2 automaton (google-re2):
one pass over the text, whatever it holds. Python's re tried the whole alternation at every
position, about 12 us a character, so an anonymous request with a fresh 512-character
agent cost 6 ms of CPU; RE2 takes about 25 us, at most about 0.3 ms when an exclusion
must be removed first (bench/hostile.py). The few expressions RE2 cannot run (lookarounds)
go through re. Both look at the first UA_ANALYSED_CHARS characters only: a
real browser's agent is far shorter, and the cap is also the cache key, so unique endings
past it cannot defeat the caches.
"""

from __future__ import annotations

import functools
import re

from crawlerdetect.providers.crawlers import data as CRAWLER_PATTERNS
from crawlerdetect.providers.exclusions import data as EXCLUSION_PATTERNS

from enrichment.memo import Memo

CACHE_ENTRIES = 10_000
UA_ANALYSED_CHARS = 512
DESKTOP, MOBILE, TABLET = "desktop", "mobile", "tablet"
_MOBILE_OS = frozenset({"iOS", "Windows Phone", "BlackBerry OS", "KaiOS", "Firefox OS"})


# RE2's lazily built DFA is capped at this much memory a worker; past it RE2 starts the
# cache over, so hostile agents cost time, not memory (measured: 4 MiB, 25 us a verdict over
# 3,000 random 512-character agents).
_RE2_MEMORY = 16 << 20
_LOOKAROUND = re.compile(r"\(\?<?[=!]")

# A leading "[...]*" lets an alternative start anywhere in a run of those characters, and
# Python's re then tries every start (time quadratic in the run). Whether the alternation
# matches somewhere does not change without it, as "[...]*" may match nothing.
_LEADING_STAR_CLASS = re.compile(r"^\[(?:\\.|[^\]\\])*\]\*")


class _Alternation:
    """Many alternatives as one case-insensitive expression, searched in RE2 (but for the
    lookarounds RE2 lacks, which stay in re). Removal is re's sub(), as crawlerdetect's,
    run only when RE2 finds something to remove: google-re2's sub() loops in Python (7 us
    a match), and re tries the alternation at every position (0.4 us a character)."""

    def __init__(self, patterns: list[str], *, removable: bool = False):
        import re2  # noqa: PLC0415 - loaded with the expressions, on first use

        options = re2.Options()
        options.case_sensitive = False
        options.max_mem = _RE2_MEMORY
        options.log_errors = False
        rest = [pattern for pattern in patterns if _LOOKAROUND.search(pattern)]
        self._re2 = re2.compile(_alternation([p for p in patterns if p not in rest]), options)
        self._rest = re.compile(_alternation([_LEADING_STAR_CLASS.sub("", p) for p in rest]),
                                re.IGNORECASE) if rest else None
        # Only the exclusions are ever removed: the crawlers' 1,462 alternatives compiled
        # for re would hold 1.8 MiB a worker for nothing.
        self._removal = (re.compile(_alternation(patterns), re.IGNORECASE) if removable
                         else None)

    def search(self, text: str) -> bool:
        return self._re2.search(text) is not None or (
            self._rest is not None and self._rest.search(text) is not None)

    def remove(self, text: str) -> str:
        return self._removal.sub("", text) if self.search(text) else text


def _alternation(patterns: list[str]) -> str:
    return "(" + "|".join(patterns) + ")"


@functools.cache
def _expressions() -> tuple[_Alternation, _Alternation]:
    """(crawlers, exclusions), compiled on first use, not at import."""
    return _Alternation(CRAWLER_PATTERNS), _Alternation(EXCLUSION_PATTERNS, removable=True)


def looks_automated(ua: str) -> bool:
    """crawlerdetect's CrawlerDetect().is_crawler(ua), in time linear in the length."""
    ua = ua.strip()
    if not ua:
        return False
    crawlers, exclusions = _expressions()
    agent = exclusions.remove(ua)
    return bool(agent) and crawlers.search(agent)


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
def _browser_and_os() -> _FirstMatch:
    """ua-parser's browser and OS expressions (built on first use; each is compiled for
    Python's re only when the filter first names it)."""
    from ua_parser.loaders import load_lazy_builtins

    browsers, systems, _devices = load_lazy_builtins()
    return _FirstMatch(browsers, systems)


class _FirstMatch:
    """The first of ua-parser's browser and of its OS expressions that matches, as its
    Rust resolver (ua-parser-rs) answers, in a fraction of its memory: ua-parser-rs holds
    its expressions as one Unicode regex set, 11 MiB a worker; RE2's filter takes 3 MiB
    and about 10 us more a parse (cached per agent). The filter's expressions are loosened
    (`.{0,100}` becomes `.*`), so it names a superset of the expressions that match, in
    any order; each is then tried in table order, as ua-parser's own re2 resolver does
    only for the first (it answers nothing when that one fails)."""

    def __init__(self, browsers: list, systems: list):
        import re2  # noqa: PLC0415 - loaded with the expressions, on first use
        from ua_parser.utils import fa_simplifier  # noqa: PLC0415

        self._tables = []
        for matchers in (browsers, systems):
            candidates = re2.Filter()
            for matcher in matchers:
                candidates.Add(fa_simplifier(matcher.regex))
            candidates.Compile()
            self._tables.append((candidates, matchers))

    def __call__(self, ua: str) -> tuple:
        return tuple(_first(candidates, matchers, ua) for candidates, matchers in self._tables)


def _first(candidates, matchers: list, ua: str):
    for index in sorted(candidates.Match(ua) or ()):
        if (found := matchers[index](ua)) is not None:
            return found
    return None

# The tablets ua-parser's device table names from tokens other than "iPad" and "Tablet":
# Puffin's tablet builds (iOS "IT", Android "AT").
_PUFFIN_TABLET = re.compile(r"Puffin/[\d.]+[AI]T")


def describe_agent(ua: str) -> tuple[str | None, str | None, str]:
    agent, system = _browser_and_os()(ua)
    browser = agent.family if agent else None
    os_family = system.family if system else None
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
