"""Tally's channels against Google's list of source categories (the list GA4's default
channel group uses), display names, the search-subdomain rule and AI assistants."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

import attribution.build_sources as build_sources
from attribution import classify_visit
from attribution.build_sources import DATA, SourceListError, build
from attribution.sources import default_catalog, resolve_source

SITE = ("example.com", "www.example.com")
GA4_CHANNEL = {
    "SOURCE_CATEGORY_SEARCH": "Organic Search",
    "SOURCE_CATEGORY_SOCIAL": "Organic Social",
    "SOURCE_CATEGORY_SHOPPING": "Organic Shopping",
    "SOURCE_CATEGORY_VIDEO": "Organic Video",
}


def _google_list() -> list[tuple[str, str]]:
    with open(DATA / "ga4" / "ga4_source_categories.csv", encoding="utf-8", newline="") as f:
        return [(row["source"], row["source_category"]) for row in csv.DictReader(f)]


GOOGLE = _google_list()


def test_googles_list_is_the_copy_its_origin_note_describes():
    assert len(GOOGLE) == 819
    assert {category for _, category in GOOGLE} == set(GA4_CHANNEL)
    origin = (DATA / "ga4" / "ORIGIN.txt").read_text(encoding="utf-8")
    assert "Velir/dbt-ga4" in origin and "seeds/ga4_source_categories.csv" in origin
    assert "MIT License" in (DATA / "ga4" / "LICENSE").read_text(encoding="utf-8")


@pytest.mark.parametrize(("source", "category"), GOOGLE, ids=[s for s, _ in GOOGLE])
def test_every_source_on_googles_list_gets_ga4s_channel(source, category):
    touch = classify_visit(None, {"utm_source": source}, (), SITE)
    assert touch.channel == GA4_CHANNEL[category]


def test_a_source_has_one_name_in_any_case_and_with_a_domain_ending():
    catalog = default_catalog()
    for source, _ in GOOGLE:
        name = catalog.by_name(source).name
        spellings = [source.upper(), source.title(), f"  {source} "]
        if "." not in source:
            spellings += [f"{source}.com", f"www.{source}.com", f"{source.upper()}.COM"]
        for spelling in spellings:
            assert catalog.by_name(spelling).name == name, (source, spelling)


@pytest.mark.parametrize("referrer", ["reddit.com", "www.reddit.com", "old.reddit.com"])
@pytest.mark.parametrize("utm_source", [None, "reddit", "Reddit", "REDDIT", "reddit.com",
                                        "Reddit.com", "www.reddit.com"])
def test_reddit_is_reddit_however_it_arrives(referrer, utm_source):
    touch = classify_visit(referrer, {"utm_source": utm_source}, (), SITE)
    assert (touch.source, touch.channel) == ("Reddit", "Organic Social")


# The examples the list check found: utm_source values and referrers that were Referral.
ISSUE_EXAMPLES = [
    (None, "yahoo", "Yahoo", "Organic Search"),
    (None, "yahoo.com", "Yahoo", "Organic Search"),
    (None, "msn", "MSN", "Organic Search"),
    (None, "naver.com", "Naver", "Organic Search"),
    (None, "seznam.cz", "Seznam", "Organic Search"),
    ("it.images.search.yahoo.com", None, "Yahoo", "Organic Search"),
    ("s3-us3.ixquick.com", None, "IxQuick", "Organic Search"),
    ("character.ai", None, "Character.ai", "AI Assistants"),
    ("poe.com", None, "Poe", "AI Assistants"),
]


@pytest.mark.parametrize(("referrer", "utm_source", "source", "channel"), ISSUE_EXAMPLES)
def test_the_examples_that_were_referral(referrer, utm_source, source, channel):
    touch = classify_visit(referrer, {"utm_source": utm_source}, (), SITE)
    assert (touch.source, touch.channel) == (source, channel)


# A subdomain of a search engine is that engine when every label it adds is a search
# word, a server number or a country code; any other label makes it another site.
SEARCH_SUBDOMAINS = [
    ("images.search.yahoo.com", "Yahoo"),
    ("it.images.search.yahoo.com", "Yahoo"),
    ("fr.search.yahoo.com", "Yahoo"),
    ("video.search.yahoo.com", "Yahoo"),
    ("search.google.com", "Google"),
    ("images.google.de", "Google"),
    ("s3-us3.ixquick.com", "IxQuick"),
    ("s9-eu4.startpage.com", "Startpage"),
    ("html.duckduckgo.com", "DuckDuckGo"),
    ("de.images.search.yahoo.com", "Yahoo"),
]
OTHER_SITES = [
    "accounts.google.com", "mail.google.com", "docs.google.com", "myaccount.google.com",
    "mail.yahoo.com", "news.yahoo.com", "login.yahoo.com", "maps.yandex.ru",
    "status.duckduckgo.com", "support.startpage.com", "translate.yandex.ru.evil.example",
]


@pytest.mark.parametrize(("host", "engine"), SEARCH_SUBDOMAINS)
def test_a_search_subdomain_is_its_engine(host, engine):
    assert resolve_source(host, None, (), SITE).name == engine
    assert classify_visit(host, {}, (), SITE).channel == "Organic Search"


@pytest.mark.parametrize("host", OTHER_SITES)
def test_another_subdomain_of_a_search_engine_is_another_site(host):
    touch = classify_visit(host, {}, (), SITE)
    assert (touch.source, touch.channel) == (host, "Referral")


AI_ASSISTANTS = [
    ("ChatGPT", ["chatgpt.com", "chat.openai.com"], ["chatgpt", "chatgpt.com"]),
    ("Perplexity", ["perplexity.ai", "www.perplexity.ai"], ["perplexity", "perplexity.ai"]),
    ("Claude", ["claude.ai"], ["claude", "claude.ai"]),
    ("Gemini", ["gemini.google.com", "bard.google.com"], ["gemini", "gemini.google.com"]),
    ("Copilot", ["copilot.microsoft.com", "copilot.com"], ["copilot", "copilot.microsoft.com"]),
    ("Character.ai", ["character.ai", "beta.character.ai"], ["character.ai", "Character.AI"]),
    ("Poe", ["poe.com"], ["poe", "poe.com"]),
    ("DeepSeek", ["chat.deepseek.com", "deepseek.com"], ["deepseek", "DeepSeek"]),
    ("Meta AI", ["meta.ai", "www.meta.ai"], ["meta ai", "meta.ai"]),
    ("Mistral Le Chat", ["chat.mistral.ai"], ["mistral le chat", "le chat",
                                               "chat.mistral.ai"]),
]


@pytest.mark.parametrize(("name", "hosts", "utm_sources"), AI_ASSISTANTS,
                         ids=[a[0] for a in AI_ASSISTANTS])
def test_ai_assistants_by_referrer_and_by_utm_source(name, hosts, utm_sources):
    for host in hosts:
        assert classify_visit(host, {}, (), SITE) == classify_visit(
            None, {"utm_source": name}, (), SITE)
        touch = classify_visit(host, {}, (), SITE)
        assert (touch.source, touch.channel) == (name, "AI Assistants"), host
    for value in utm_sources:
        touch = classify_visit(None, {"utm_source": value}, (), SITE)
        assert (touch.source, touch.channel) == (name, "AI Assistants"), value


def test_every_display_name_has_one_category():
    data = json.loads((DATA / "sources.json").read_text(encoding="utf-8"))
    categories: dict[str, set[str]] = {}
    for name, category in [*data["hosts"].values(), *data["names"].values()]:
        categories.setdefault(name, set()).add(category)
    assert {name: c for name, c in categories.items() if len(c) > 1} == {}


def test_every_override_has_a_reason_and_names_a_real_disagreement():
    overrides = yaml.safe_load((DATA / "overrides.yml").read_text(encoding="utf-8"))
    assert overrides
    google = {source.lower(): category for source, category in GOOGLE}
    for override in overrides:
        assert len(override["reason"].split()) >= 10, override
        for source in override["google"]:
            assert GA4_CHANNEL[google[source.lower()]] == "Organic " + {
                "search": "Search", "social": "Social", "shopping": "Shopping",
                "video": "Video"}[override["category"]]
    # Digg moves as a whole (Matomo listed it as a search engine); rakuten.co.jp splits
    # off Tally's shopping entry Rakuten Ichiba, whose other hosts stay shopping.
    catalog = default_catalog()
    assert catalog.by_host("digg.com").category == "social"
    assert catalog.by_name("Digg").category == "social"
    assert catalog.by_host("www.rakuten.co.jp") == catalog.by_name("rakuten")
    assert catalog.by_host("rakuten.de").name == "Rakuten Ichiba"


def _build_with(monkeypatch, name, change):
    load = build_sources._load

    def patched(file_name):
        value = load(file_name)
        return change(value) if file_name == name else value

    monkeypatch.setattr(build_sources, "_load", patched)
    return build


def test_the_build_fails_while_a_disagreement_is_not_in_overrides(monkeypatch):
    rebuild = _build_with(monkeypatch, "overrides.yml", lambda entries: entries[1:])
    with pytest.raises(SourceListError, match=r"digg \(Google: social, Tally: Digg, search\)"):
        rebuild()


def test_the_build_fails_on_an_override_that_settles_nothing(monkeypatch):
    extra = {"google": ["reddit"], "category": "social", "was": "Reddit (social)",
             "name": "Reddit", "reason": "none needed"}
    rebuild = _build_with(monkeypatch, "overrides.yml", lambda entries: [*entries, extra])
    with pytest.raises(SourceListError, match="need no override"):
        rebuild()


def test_the_build_fails_when_a_name_would_have_two_categories(monkeypatch):
    def rename(curated):
        return {**curated, "names": {**curated["names"], "msn": "Reddit"}}

    rebuild = _build_with(monkeypatch, "curated.yml", rename)
    with pytest.raises(SourceListError, match="'Reddit' would be both"):
        rebuild()
