"""enrichment/: user agents, bots, URL pieces, countries and daily-salted visitor ids."""

from __future__ import annotations

import functools
import hashlib

import iptocc
import pytest

from enrichment.agents import AgentParser, BotFilter, describe_agent
from enrichment.memo import Memo
from enrichment.urls import campaign, pathname, url_host
from enrichment.visitor import VisitorSalts, utc_day, visitor_id
from storage.backend import open_database
from tests.conftest import FakeClock, config_for, counting_bytes
from vocabulary import DAY_MS

CHROME_WINDOWS = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko)"
                  " Chrome/120.0.0.0 Safari/537.36")
SAFARI_MAC = ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"
              " Version/17.0 Safari/605.1.15")
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
          "Gecko) Version/17.0 Mobile/15E148 Safari/604.1")
IPAD = ("Mozilla/5.0 (iPad; CPU OS 16_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/16.0 Mobile/15E148 Safari/604.1")
ANDROID_PHONE = ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
                 "Chrome/120.0.0.0 Mobile Safari/537.36")
ANDROID_TABLET = ("Mozilla/5.0 (Linux; Android 13; SM-X700) AppleWebKit/537.36 (KHTML, like Gecko) "
                  "Chrome/120.0.0.0 Safari/537.36")
FIREFOX_LINUX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
EDGE = CHROME_WINDOWS + " Edg/120.0.0.0"


@pytest.mark.parametrize(
    ("ua", "expected"),
    [
        (CHROME_WINDOWS, ("Chrome", "Windows", "desktop")),
        (EDGE, ("Edge", "Windows", "desktop")),
        (SAFARI_MAC, ("Safari", "Mac OS X", "desktop")),
        (FIREFOX_LINUX, ("Firefox", "Linux", "desktop")),
        (IPHONE, ("Mobile Safari", "iOS", "mobile")),
        (IPAD, ("Mobile Safari", "iOS", "tablet")),
        (ANDROID_PHONE, ("Chrome Mobile", "Android", "mobile")),
        (ANDROID_TABLET, ("Chrome", "Android", "tablet")),
        ("something unheard of", (None, None, "desktop")),
    ],
)
def test_browser_os_and_device(ua, expected):
    assert describe_agent(ua) == expected
    parser = AgentParser()
    assert parser.describe(ua) == expected == parser.describe(ua)


def test_agent_cache_is_bounded():
    parser = AgentParser(max_entries=2)
    for ua in (CHROME_WINDOWS, IPHONE, IPAD, FIREFOX_LINUX):
        parser.describe(ua)
    assert len(parser._parsed) <= 2
    assert parser.describe(IPAD) == ("Mobile Safari", "iOS", "tablet")


@pytest.mark.parametrize(
    ("ua", "bot"),
    [
        ("Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)", True),
        ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
         "HeadlessChrome/120.0.0.0 Safari/537.36", True),
        ("curl/8.5.0", True),
        ("python-requests/2.31.0", True),
        ("python-httpx/0.27.0", True),
        ("Apache-HttpClient/4.5.14 (Java/17.0.9)", True),
        (CHROME_WINDOWS, False),
        (IPHONE, False),
        (FIREFOX_LINUX, False),
    ],
)
def test_bot_verdicts(ua, bot):
    bots = BotFilter(max_entries=3)
    assert bots.is_bot(ua) is bot
    assert bots.is_bot(ua) is bot  # from the cache
    assert dict(bots._verdicts) == {ua: bot}


@pytest.mark.parametrize(
    ("url", "end", "path"),
    [
        ("https://example.com", 19, "/"),
        ("https://example.com/", 19, "/"),
        ("https://example.com?x=1", 19, "/"),
        ("https://example.com#top", 19, "/"),
        ("https://example.com/a/b?x=1#y", 19, "/a/b"),
        ("https://example.com:8080/a%20b/", 24, "/a%20b/"),
        ("https://example.com/a#b?c", 19, "/a"),
        ("https://example.com/a?b#c", 19, "/a"),
        ("https://example.com/?#", 19, "/"),
        ("https://example.com/a/b#", 19, "/a/b"),
    ],
)
def test_pathname(url, end, path):
    assert pathname(url, end) == path


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://e.com/", {}),
        ("https://e.com/?q=1", {}),
        ("https://e.com/?utm_source=Google+Ads&utm_medium=cpc&utm_campaign=spring%20sale",
         {"utm_source": "Google Ads", "utm_medium": "cpc", "utm_campaign": "spring sale"}),
        ("https://e.com/?utm_term=t&utm_content=c&utm_source=a&utm_source=b",
         {"utm_term": "t", "utm_content": "c", "utm_source": "a"}),
        ("https://e.com/?gclid=g&gbraid=gb&wbraid=wb&msclkid=m&fbclid=f",
         {"gclid": "g", "gbraid": "gb", "wbraid": "wb", "msclkid": "m", "fbclid": "f"}),
        ("https://e.com/#?utm_source=fragment", {}),
        ("https://e.com/?x=1#utm_source=fragment", {}),
        ("https://e.com/?utm_source=&utm_medium=email", {"utm_medium": "email"}),
        ("https://e.com/?UTM_SOURCE=upper", {}),
    ],
)
def test_campaign_parameters(url, expected):
    names = ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content",
             "gclid", "gbraid", "wbraid", "msclkid", "fbclid")
    assert dict(zip(names, campaign(url), strict=True)) == {n: expected.get(n) for n in names}


@pytest.mark.parametrize(
    ("url", "host"),
    [
        (None, None),
        ("", None),
        ("https://www.Google.com/search?q=x", "www.google.com"),
        ("http://t.co:443/abc", "t.co"),
        ("https://user:pw@news.ycombinator.com./item", "news.ycombinator.com"),
        ("android-app://com.google.android.gm/", "com.google.android.gm"),
        ("not a url", None),
        ("/relative/path", None),
    ],
)
def test_referrer_host(url, host):
    assert url_host(url) == host


@pytest.mark.parametrize(
    ("ip", "country"),
    [("81.2.69.142", "GB"), ("8.8.8.8", "US"), ("2a00:1450:4001::1", "IE"),
     ("127.0.0.1", None), ("10.1.2.3", None)],
)
def test_country_from_the_offline_database(ip, country):
    assert iptocc.country_code(ip) == country


# Visitor ids and salts ---------------------------------------------------------------


@pytest.fixture
def db(db_path):
    database = open_database(config_for(db_path))
    yield database
    database.close()


def test_same_visitor_same_id_across_workers(db):
    clock = FakeClock()
    day = utc_day(int(clock() * 1000))
    worker_a = VisitorSalts(db, clock, counting_bytes())
    worker_b = VisitorSalts(db, clock, lambda n: b"\xff" * n)  # would pick another salt
    conn_a, conn_b = db.connect(), db.connect()
    salt = worker_a.salt(conn_a, day)
    assert worker_b.salt(conn_b, day) == salt  # the first writer's salt wins
    assert salt.dated  # a salt made now gives ids that carry its day
    ip = bytes([203, 0, 113, 7])
    assert visitor_id(salt.salt, 1, ip, FIREFOX_LINUX, day) == visitor_id(
        worker_b.salt(conn_b, day).salt, 1, ip, FIREFOX_LINUX, day)
    conn_a.close()
    conn_b.close()


@pytest.mark.parametrize("day", [None, 20_000])
def test_visitor_id_depends_on_every_input(day):
    salt, other_salt = b"s" * 32, b"t" * 32
    ip, other_ip = bytes([203, 0, 113, 7]), bytes([203, 0, 113, 8])
    base = visitor_id(salt, 1, ip, FIREFOX_LINUX, day)
    assert isinstance(base, int) and -(2**63) <= base < 2**63
    variants = [visitor_id(other_salt, 1, ip, FIREFOX_LINUX, day),
                visitor_id(salt, 2, ip, FIREFOX_LINUX, day),
                visitor_id(salt, 1, other_ip, FIREFOX_LINUX, day),
                visitor_id(salt, 1, ip, IPHONE, day)]
    assert base not in variants and len(set(variants)) == 4


@pytest.mark.parametrize("day", [0, 1, 20_000, 32_766, 32_767, 32_768, 65_534, 2**40])
def test_a_dated_id_is_its_days_field_over_48_bits_of_hash(day):
    # Bit 63 clear, 1 + day % 32767 in bits 48..62 (never 0: no id is the erased
    # visitor's 0), the hash below; ids of later days sort after (within the period).
    field = 1 + day % 32_767
    ids = [visitor_id(bytes([n]) * 32, 7, bytes([203, 0, 113, n]), FIREFOX_LINUX, day)
           for n in range(64)]
    assert all(0 < i < 2**63 and i >> 48 == field for i in ids)
    assert len(set(ids)) == 64
    if field < 32_767:
        later = visitor_id(b"s" * 32, 7, bytes(4), FIREFOX_LINUX, day + 1)
        assert later > max(ids)


def test_a_dated_id_is_the_keyed_48_bit_hash_of_its_inputs():
    salt, ip, day = bytes(range(32)), bytes(range(16)), 20_700
    digest = hashlib.blake2b((7).to_bytes(8, "big", signed=True) + bytes((len(ip),)) + ip
                             + FIREFOX_LINUX.encode(), key=salt, digest_size=6).digest()
    expected = (1 + day % 32_767) << 48 | int.from_bytes(digest, "big")
    assert visitor_id(salt, 7, ip, FIREFOX_LINUX, day) == expected


@pytest.mark.parametrize("ip", [bytes([203, 0, 113, 7]), bytes(range(16))])
def test_a_visitor_id_is_the_keyed_hash_of_its_inputs_in_one_order(ip):
    # The ids stored today must be the ids computed tomorrow by a newer release: a visit
    # open across an upgrade continues only if its visitor id is the same.
    salt = bytes(range(32))
    expected = hashlib.blake2b((7).to_bytes(8, "big", signed=True) + bytes((len(ip),)) + ip
                               + FIREFOX_LINUX.encode(), key=salt, digest_size=8).digest()
    assert visitor_id(salt, 7, ip, FIREFOX_LINUX) == int.from_bytes(expected, "big", signed=True)


def test_salts_rotate_daily_and_are_kept_at_most_48_hours(db):
    clock = FakeClock(20_000 * 86_400 + 3_600)  # 01:00 UTC on day 20,000
    salts = VisitorSalts(db, clock, counting_bytes())
    conn = db.connect()
    today = utc_day(int(clock() * 1000))
    first = salts.salt(conn, today)
    clock.advance(86_400)
    second = salts.salt(conn, today + 1)
    assert first != second
    salts.prune(conn)
    stored = [r[0] for r in conn.execute("SELECT day FROM visitor_salts ORDER BY day")]
    assert stored == [today, today + 1]  # yesterday's salt stays for visits across midnight
    clock.set((today + 2) * DAY_MS / 1000)  # midnight starting the day after tomorrow
    salts.prune(conn)
    assert [r[0] for r in conn.execute("SELECT day FROM visitor_salts")] == [today + 1]
    assert salts._salts == {today + 1: second}
    conn.close()


def test_salts_come_from_the_injected_randomness(db):
    clock = FakeClock()
    random_bytes = counting_bytes()
    expected = counting_bytes()(32)
    salts = VisitorSalts(db, clock, random_bytes)
    conn = db.connect()
    assert salts.salt(conn, 7).salt == expected
    conn.close()


def test_memo_is_bounded_in_entries_and_key_length():
    calls = []
    memo = Memo(lambda key: calls.append(key) or len(key), max_entries=2, max_key_length=10)
    assert [memo["a"], memo["bb"], memo["a"]] == [1, 2, 1]
    assert calls == ["a", "bb"]
    memo["ccc"]
    assert len(memo) <= 2
    long_key = "x" * 11
    assert memo[long_key] == 11 and memo[long_key] == 11
    assert long_key not in memo and calls.count(long_key) == 2


def test_memo_add_passes_what_follows_from_the_key_and_keeps_the_bounds():
    calls = []
    memo = Memo(lambda key, start: calls.append(key) or key[start:], max_entries=2,
                max_key_length=10)
    assert memo.add("https", 5) == "" and memo.get("https") == ""
    assert memo.add("a:b", 2) == "b" and memo.add("ccc", 1) == "cc"
    assert len(memo) <= 2 and calls == ["https", "a:b", "ccc"]
    long_key = "x" * 11
    assert memo.add(long_key, 10) == "x" and long_key not in memo


@functools.cache
def _reference_parser():
    """ua-parser's reference resolver: every uap-core expression as written, in Python's re,
    tried in table order."""
    from ua_parser import BasicResolver, Parser
    from ua_parser.loaders import load_builtins

    return Parser(BasicResolver(load_builtins()))


def _with_device_table(ua: str) -> str:
    """The device type as ua-parser's full device table decided it before it was left out."""
    from ua_parser import Domain

    result = _reference_parser()(ua, Domain.ALL)
    family = result.device.family if result.device else ""
    os_family = result.os.family if result.os else None
    if family == "iPad" or "Tablet" in family or "Tablet" in ua or "iPad" in ua:
        return "tablet"
    if "Mobi" in ua or os_family in ("iOS", "Windows Phone", "BlackBerry OS", "KaiOS", "Firefox OS"):
        return "mobile"
    return "tablet" if os_family == "Android" else "desktop"


@pytest.mark.parametrize("model", ["SM-T230", "MediaPad T5", "Lenovo TB-X606F", "MyPad 7",
                                   "KFTRWI", "Xoom", "Pixel 7", "Transformer Pad TF300T"])
@pytest.mark.parametrize("version", ["3.2", "13"])
@pytest.mark.parametrize("mobile", ["Mobile ", ""])
def test_the_device_type_is_what_the_device_table_said(model, version, mobile):
    ua = (f"Mozilla/5.0 (Linux; Android {version}; {model} Build/XYZ) AppleWebKit/537.36"
          f" (KHTML, like Gecko) Chrome/120 {mobile}Safari/537.36")
    assert describe_agent(ua)[2] == _with_device_table(ua)


@pytest.mark.parametrize("build", ["AT", "IT", "AP", "IP"])
def test_puffin_tablets_are_tablets_as_the_device_table_said(build):
    ua = ("Mozilla/5.0 (X11; U; Linux x86_64; en-US) AppleWebKit/537.36 (KHTML, like Gecko)"
          f" Chrome/120 Safari/537.36 Puffin/9.0.0.50263{build}")
    assert describe_agent(ua)[2] == _with_device_table(ua)


# The filter in front of the expressions loosens ".{0,100}" to ".*", so the first expression
# it names can fail as written: the next one in table order must answer (here "CFNetwork"
# with more than 100 characters before "Darwin/" is not iOS, and the OS comes from "CrOS").
@pytest.mark.parametrize("ua", [
    CHROME_WINDOWS, EDGE, SAFARI_MAC, FIREFOX_LINUX, IPHONE, IPAD, ANDROID_PHONE, ANDROID_TABLET,
    "MyApp/2.1 CFNetwork/1410.0.3 Darwin/22.6.0",
    "MyApp/2.1 CFNetwork/1410.0.3 " + "x" * 120 + " Darwin/22.6.0",
    "Mozilla/5.0 (X11; CrOS x86_64 15633.69.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/"
    + "1" * 110 + " Safari/537.36 CitrixChromeApp",
    "CrOS x86_64 15633.69.0 CFNetwork/81 " + "y" * 101 + " Darwin/17151",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "curl/8.4.0", "python-requests/2.31.0", "",
])
def test_browser_and_os_are_the_reference_parsers(ua):
    from ua_parser import Domain

    expected = _reference_parser()(ua, Domain.USER_AGENT | Domain.OS)
    family = [None if part is None or part.family == "Other" else part.family
              for part in (expected.user_agent, expected.os)]
    assert list(describe_agent(ua)[:2]) == family
