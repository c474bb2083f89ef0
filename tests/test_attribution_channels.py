"""Source canonicalization and GA4 default channel classification, as tables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attribution import classify_visit
from attribution.build_sources import OUTPUT, build, render
from attribution.channels import ALL_CHANNELS, CHANNELS, classify_channel
from attribution.sources import Source, default_catalog, resolve_source

SITE = ("example.com", "www.example.com")

# (referrer host, utm_source, click ids) -> expected Source (None: direct)
SOURCE_CASES = [
    ("google.com", None, (), Source("Google", "search")),
    ("www.google.com", None, (), Source("Google", "search")),
    ("google.co.uk", None, (), Source("Google", "search")),
    ("www.google.co.uk", None, (), Source("Google", "search")),
    ("www.google.de", None, (), Source("Google", "search")),
    ("GOOGLE.COM.", None, (), Source("Google", "search")),
    ("www.google.com:443", None, (), Source("Google", "search")),
    ("bing.com", None, (), Source("Bing", "search")),
    ("www.bing.com", None, (), Source("Bing", "search")),
    ("de.search.yahoo.com", None, (), Source("Yahoo", "search")),
    ("duckduckgo.com", None, (), Source("DuckDuckGo", "search")),
    ("t.co", None, (), Source("Twitter", "social")),
    ("x.com", None, (), Source("Twitter", "social")),
    ("twitter.com", None, (), Source("Twitter", "social")),
    ("mobile.twitter.com", None, (), Source("Twitter", "social")),
    ("l.facebook.com", None, (), Source("Facebook", "social")),
    ("m.facebook.com", None, (), Source("Facebook", "social")),
    # Matomo also lists www.facebook.com as a search engine; the social network wins.
    ("www.facebook.com", None, (), Source("Facebook", "social")),
    ("www.linkedin.com", None, (), Source("LinkedIn", "social")),
    ("plus.google.com", None, (), Source("Google+", "social")),
    ("youtube.com", None, (), Source("YouTube", "video")),
    ("m.youtube.com", None, (), Source("YouTube", "video")),
    ("youtu.be", None, (), Source("YouTube", "video")),
    ("vimeo.com", None, (), Source("Vimeo", "video")),
    ("www.twitch.tv", None, (), Source("Twitch", "video")),
    ("www.amazon.co.uk", None, (), Source("Amazon", "shopping")),
    ("ebay.de", None, (), Source("eBay", "shopping")),
    ("chatgpt.com", None, (), Source("ChatGPT", "ai")),
    ("claude.ai", None, (), Source("Claude", "ai")),
    ("www.perplexity.ai", None, (), Source("Perplexity", "ai")),
    ("gemini.google.com", None, (), Source("Gemini", "ai")),
    ("copilot.microsoft.com", None, (), Source("Copilot", "ai")),
    # Unknown referrers: the host without www.
    ("www.some-blog.io", None, (), Source("some-blog.io")),
    ("news.example.org", None, (), Source("news.example.org")),
    # A Google subdomain that is no search engine stays a plain referrer.
    ("accounts.google.com", None, (), Source("accounts.google.com")),
    # The site's own hosts and localhost are no source.
    ("example.com", None, (), None),
    ("www.example.com", None, (), None),
    ("EXAMPLE.COM:8443", None, (), None),
    ("localhost", None, (), None),
    ("localhost:3000", None, (), None),
    ("app.localhost", None, (), None),
    ("127.0.0.1", None, (), None),
    ("[::1]", None, (), None),
    ("", None, (), None),
    (None, None, (), None),
    # A subdomain of the site is another site.
    ("blog.example.com", None, (), Source("blog.example.com")),
    # utm_source wins: a known source under its display name, anything else as sent.
    ("google.com", "newsletter", (), Source("newsletter")),
    (None, "google", (), Source("Google", "search")),
    (None, "Facebook", (), Source("Facebook", "social")),
    (None, "fb", (), Source("Facebook", "social")),
    (None, "youtube", (), Source("YouTube", "video")),
    (None, "reddit.com", (), Source("Reddit", "social")),
    (None, "  partner-x  ", (), Source("partner-x")),
    (None, "Partner-X", (), Source("Partner-X")),
    # A label of a host in Matomo's lists names a source only when it is the source's
    # name (google.de, youtu.be); friends.nyc.mn is a Mastodon server, shop.app Shopify's.
    (None, "youtu", (), Source("YouTube", "video")),
    (None, "friends", (), Source("friends")),
    (None, "wow", (), Source("wow")),
    (None, "shop", (), Source("shop")),
    (None, "shop.app", (), Source("Shopify", "shopping")),
    (None, "", (), None),
    # A click id alone names its network.
    (None, None, ("gclid",), Source("Google", "search")),
    (None, None, ("msclkid",), Source("Bing", "search")),
    (None, None, ("fbclid",), Source("Facebook", "social")),
    ("www.example.com", None, ("wbraid",), Source("Google", "search")),
]


@pytest.mark.parametrize(("referrer", "utm_source", "clicks", "expected"), SOURCE_CASES)
def test_resolve_source(referrer, utm_source, clicks, expected):
    assert resolve_source(referrer, utm_source, clicks, SITE) == expected


# (source, medium, campaign, click ids, category) -> channel
CHANNEL_CASES = [
    (None, None, None, (), None, "Direct"),
    ("(direct)", "(none)", None, (), None, "Direct"),
    (None, None, "spring", (), None, "Direct"),
    ("google", "cpc", "cross-network-q3", (), "search", "Cross-network"),
    ("partner", "email", "Cross-Network", (), None, "Cross-network"),
    ("Amazon", "cpc", None, (), "shopping", "Paid Shopping"),
    ("google", "cpc", "summer shopping", (), "search", "Paid Shopping"),
    ("google", "ppc", "shop-2026", (), "search", "Paid Shopping"),
    ("google", "cpc", None, (), "search", "Paid Search"),
    ("Bing", "paidsearch", None, (), "search", "Paid Search"),
    ("Google", None, None, ("gclid",), "search", "Paid Search"),
    ("Google", None, None, ("gbraid",), "search", "Paid Search"),
    ("google.co.uk", None, None, ("wbraid",), "search", "Paid Search"),
    ("Bing", None, None, ("msclkid",), "search", "Paid Search"),
    ("Google", "organic", None, ("gclid",), "search", "Paid Search"),
    ("Bing", None, None, ("gclid",), "search", "Organic Search"),
    ("newsletter", None, None, ("gclid",), None, "Email"),
    ("Facebook", "cpc", None, (), "social", "Paid Social"),
    ("Facebook", "paid_social", None, ("fbclid",), "social", "Paid Social"),
    ("Facebook", None, None, ("fbclid",), "social", "Organic Social"),
    ("LinkedIn", "retargeting", None, (), "social", "Paid Social"),
    ("YouTube", "cpv", None, (), "video", "Paid Video"),
    ("partner", "display", None, (), None, "Display"),
    ("adnet", "banner", None, (), None, "Display"),
    ("adnet", "cpm", None, (), None, "Display"),
    ("Google", "cpm", None, (), "search", "Paid Search"),
    ("adnet", "interstitial", None, (), None, "Display"),
    ("adnet", "ppc", None, (), None, "Paid Other"),
    (None, "paid", None, (), None, "Paid Other"),
    ("eBay", None, None, (), "shopping", "Organic Shopping"),
    ("partner", "referral", "shop", (), None, "Organic Shopping"),
    ("partner", None, "workshop", (), None, "Referral"),
    ("Twitter", None, None, (), "social", "Organic Social"),
    ("Twitter", "referral", None, (), "social", "Organic Social"),
    ("forum", "social-media", None, (), None, "Organic Social"),
    ("YouTube", None, None, (), "video", "Organic Video"),
    ("partner", "video_embed", None, (), None, "Organic Video"),
    ("ChatGPT", None, None, (), "ai", "AI Assistants"),
    ("Perplexity", "referral", None, (), "ai", "AI Assistants"),
    ("Google", None, None, (), "search", "Organic Search"),
    ("DuckDuckGo", "referral", None, (), "search", "Organic Search"),
    ("some-engine", "organic", None, (), None, "Organic Search"),
    ("email", None, None, (), None, "Email"),
    ("mailchimp", "e-mail", None, (), None, "Email"),
    ("crm", "e_mail", None, (), None, "Email"),
    ("crm", "E Mail", None, (), None, "Email"),
    ("weekly-newsletter", "blast", None, (), None, "Email"),
    ("crm", "newsletter", None, (), None, "Email"),
    ("partner", "affiliate", None, (), None, "Affiliates"),
    ("blog.io", "referral", None, (), None, "Referral"),
    ("app-store", "app", None, (), None, "Referral"),
    ("podcast", "audio", None, (), None, "Audio"),
    ("sms", None, None, (), None, "SMS"),
    ("twilio", "SMS", None, (), None, "SMS"),
    ("app", "web-push", None, (), None, "Mobile Push Notifications"),
    ("app", "mobile", None, (), None, "Mobile Push Notifications"),
    ("app", "in-app notification", None, (), None, "Mobile Push Notifications"),
    ("firebase", None, None, (), None, "Mobile Push Notifications"),
    ("news.ycombinator.com", None, None, (), None, "Referral"),
    ("partner", "weird", None, (), None, "Referral"),
    (None, "weird", None, (), None, "Direct"),
]


@pytest.mark.parametrize(("source", "medium", "campaign", "clicks", "category", "expected"),
                         CHANNEL_CASES)
def test_classify_channel(source, medium, campaign, clicks, category, expected):
    assert classify_channel(source, medium, campaign, clicks, category) == expected


def test_the_table_covers_every_channel():
    assert len(CHANNEL_CASES) >= 40
    assert {case[-1] for case in CHANNEL_CASES} == set(CHANNELS)
    assert ALL_CHANNELS == (*CHANNELS, "Unattributed")


_maybe_text = st.none() | st.text(max_size=30) | st.sampled_from(
    ["google", "cpc", "email", "paid", "display", "shopping", "cross-network", "sms", "(none)"])


@given(_maybe_text, _maybe_text, _maybe_text,
       st.lists(st.sampled_from(["gclid", "gbraid", "wbraid", "msclkid", "fbclid"])),
       st.none() | st.sampled_from(["search", "social", "video", "shopping", "ai"]))
def test_every_input_gets_one_of_the_listed_channels(source, medium, campaign, clicks, category):
    assert classify_channel(source, medium, campaign, clicks, category) in CHANNELS


# Whole visits: (referrer host, utm values, click ids) -> (source, channel)
VISIT_CASES = [
    ("www.google.co.uk", {}, (), ("Google", "Organic Search")),
    ("www.google.com", {}, ("gclid",), ("Google", "Paid Search")),
    (None, {}, ("gclid",), ("Google", "Paid Search")),
    (None, {}, ("msclkid",), ("Bing", "Paid Search")),
    ("l.facebook.com", {}, ("fbclid",), ("Facebook", "Organic Social")),
    ("l.facebook.com", {"utm_medium": "paid"}, ("fbclid",), ("Facebook", "Paid Social")),
    ("t.co", {}, (), ("Twitter", "Organic Social")),
    ("www.youtube.com", {}, (), ("YouTube", "Organic Video")),
    ("chatgpt.com", {}, (), ("ChatGPT", "AI Assistants")),
    ("www.example.com", {}, (), (None, "Direct")),
    ("localhost:8000", {}, (), (None, "Direct")),
    ("www.some-blog.io", {}, (), ("some-blog.io", "Referral")),
    (None, {"utm_source": "newsletter", "utm_medium": "email"}, (), ("newsletter", "Email")),
    ("google.com", {"utm_source": "google", "utm_medium": "cpc"}, (), ("Google", "Paid Search")),
    (None, {"utm_source": "amazon", "utm_medium": "cpc"}, (), ("Amazon", "Paid Shopping")),
]


@pytest.mark.parametrize(("referrer", "utm", "clicks", "expected"), VISIT_CASES)
def test_classify_visit(referrer, utm, clicks, expected):
    touch = classify_visit(referrer, utm, clicks, SITE)
    assert (touch.source, touch.channel) == expected


def test_video_hosts_beat_the_matomo_social_list():
    catalog = default_catalog()
    for host in ("youtube.com", "youtu.be", "vimeo.com", "twitch.tv"):
        assert catalog.by_host(host).category == "video", host


def test_sources_json_is_regenerated_from_its_inputs():
    assert OUTPUT.read_text(encoding="utf-8") == render(build()), (
        "run .venv/bin/python -m attribution.build_sources"
    )
