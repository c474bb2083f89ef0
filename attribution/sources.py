"""Where a visit came from: referrer host, UTM values and click ids -> a named source.

Pure functions over the data in attribution/data/sources.json (built by
attribution/build_sources.py from Google's list of source categories, Matomo's lists and
Tally's curated lists).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from importlib.resources.abc import Traversable

SOURCES_JSON = files(__package__) / "data" / "sources.json"

CATEGORIES = ("search", "social", "video", "shopping", "ai")
# A click id alone (no utm_source, no usable referrer) still names the network that added it.
_CLICK_ID_SOURCES = (
    ("gclid", "Google"), ("gbraid", "Google"), ("wbraid", "Google"),
    ("msclkid", "Bing"), ("fbclid", "Facebook"),
)
_WWW_OR_MOBILE = re.compile(r"^(?:www\d*\.|m\.)+")
_PORT = re.compile(r":\d*$")
# Labels that keep a subdomain of a search engine that engine: words for its search
# pages (images.search.yahoo.com, html.duckduckgo.com) and the numbered servers they
# run on (s3-us3.ixquick.com). A two-letter country code counts too
# (it.images.search.yahoo.com).
_SEARCH_LABEL = re.compile(r"^(?:search|images?|img|videos?|html|lite|s\d+(?:-[a-z]+\d*)?)$")
# Labels that Matomo's `{}` takes in with a country code: google.{} is google.co.uk.
_UNDER_COUNTRY = frozenset({"com", "org", "net", "co", "it", "edu"})
# Second-level labels under a country code that a registrant's name sits below
# (yelp.co.uk, yandex.com.tr, biglobe.ne.jp).
_SECOND_LEVEL = frozenset({"co", "com", "ne", "or", "org", "net", "ac", "go", "gov", "edu"})


@dataclass(frozen=True)
class Source:
    """name: shown to people (a known source's display name, else utm_source as sent or a host).
    category: one of CATEGORIES when the source is a known site, else None."""

    name: str
    category: str | None = None


class SourceCatalog:
    """Host patterns and names of known sources, with Matomo's `{}` country placeholder."""

    def __init__(self, hosts: dict[str, list[str]], names: dict[str, list[str]],
                 countries: Iterable[str]):
        self._hosts = {pattern: Source(*entry) for pattern, entry in hosts.items()}
        self._names = {name: Source(*entry) for name, entry in names.items()}
        self._countries = frozenset(countries)

    @classmethod
    def load(cls, path: Traversable = SOURCES_JSON) -> SourceCatalog:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(data["hosts"], data["names"], data["countries"])

    def by_host(self, host: str) -> Source | None:
        """The known source of a (normalized) host, or None.

        Tries the host itself, then without www./m., each with country codes replaced
        by `{}`; then the parent domains, nearest first, so l.facebook.com is Facebook
        and m.youtube.com YouTube. A search engine's subdomain is that engine only when
        every label it adds is a search word, a server number or a country code
        (it.images.search.yahoo.com, s3-us3.ixquick.com); any other label makes it
        another site (accounts.google.com, mail.yahoo.com).
        """
        base = _WWW_OR_MOBILE.sub("", host)
        for candidate in (host, base):
            for pattern in self._patterns(candidate):
                if pattern in self._hosts:
                    return self._hosts[pattern]
        labels = base.split(".")
        for start in range(1, len(labels) - 1):
            for pattern in self._patterns(".".join(labels[start:])):
                found = self._hosts.get(pattern)
                if found is None:
                    continue
                if found.category != "search" or all(
                        self._is_search_label(label) for label in labels[:start]):
                    return found
        return None

    def _is_search_label(self, label: str) -> bool:
        return label in self._countries or _SEARCH_LABEL.match(label) is not None

    def by_name(self, value: str) -> Source | None:
        """The known source a utm_source value names, in any case: 'google', 'fb', a known
        name with a domain ending ('Reddit.com', 'zalo.vn': the name wins over the host,
        so 'rakuten.com' is Rakuten like 'rakuten'), else a known host ('t.co')."""
        key = value.strip().lower()
        found = self._names.get(key)
        if found is not None or "." not in key:
            return found
        host = normalize_host(key)
        stem = domain_stem(strip_www_or_mobile(host))
        found = self._names.get(stem) if stem else None
        return found or self.by_host(host)

    def _patterns(self, host: str) -> list[str]:
        """The host, with its country-code ending (.de, .co.uk, .com.br) as `{}`, with its
        country-code first label (de.search.yahoo.com) as `{}`, and with both."""
        labels = host.split(".")
        if len(labels) < 2:
            return [host]
        countries = self._countries
        patterns = [host]
        tld = labels
        if labels[-1] in countries:
            cut = len(labels) - (2 if len(labels) > 2 and labels[-2] in _UNDER_COUNTRY else 1)
            tld = [*labels[:cut], "{}"]
            patterns.append(".".join(tld))
        if labels[0] in countries:
            patterns.append(".".join(["{}", *labels[1:]]))
        if tld is not labels and len(tld) > 1 and tld[0] in countries:
            patterns.append(".".join(["{}", *tld[1:]]))
        return patterns


@lru_cache(maxsize=1)
def default_catalog() -> SourceCatalog:
    return SourceCatalog.load()


def normalize_host(host: str) -> str:
    """Lower case, without port, brackets or a trailing dot."""
    value = host.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = _PORT.sub("", value)
    return value.rstrip(".")


def strip_www_or_mobile(host: str) -> str:
    return _WWW_OR_MOBILE.sub("", host)


def domain_stem(host: str) -> str | None:
    """The registrant's label of a bare domain: 'reddit.com', 'yelp.co.uk' -> 'reddit',
    'yelp'; None for a deeper host ('old.reddit.com') or a single label."""
    labels = host.split(".")
    if len(labels) == 2 and labels[0]:
        return labels[0]
    if len(labels) == 3 and len(labels[2]) == 2 and labels[1] in _SECOND_LEVEL and labels[0]:
        return labels[0]
    return None


def strip_www(host: str) -> str:
    return host[4:] if host.startswith("www.") else host


def is_local(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    if not (host[:1].isdigit() or ":" in host):  # parsing every name as an IP is slow
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def is_own_host(host: str, site_hosts: Collection[str]) -> bool:
    bare = strip_www(host)
    return any(bare == strip_www(normalize_host(own)) for own in site_hosts)


def resolve_source(
    referrer_host: str | None,
    utm_source: str | None,
    click_ids: Iterable[str] = (),
    site_hosts: Collection[str] = (),
    catalog: SourceCatalog | None = None,
) -> Source | None:
    """The source of a visit, or None (a direct visit).

    utm_source wins: the display name of the source it names (reddit, Reddit.com ->
    Reddit), else as sent; else a known referrer's display name (google.co.uk ->
    Google, t.co -> Twitter), else the referrer host without www.; referrers from the
    site's own hosts and from localhost count as none. Last, a click id alone names its
    network (gclid -> Google, msclkid -> Bing, fbclid -> Facebook).
    """
    catalog = catalog or default_catalog()
    if utm_source and utm_source.strip():
        name = utm_source.strip()
        return catalog.by_name(name) or Source(name)
    host = normalize_host(referrer_host) if referrer_host else ""
    if host and not is_local(host) and not is_own_host(host, site_hosts):
        return catalog.by_host(host) or Source(strip_www(host))
    present = set(click_ids)
    for click_id, network in _CLICK_ID_SOURCES:
        if click_id in present:
            return catalog.by_name(network) or Source(network)
    return None
