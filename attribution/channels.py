"""GA4's default channel group as a pure function, with the rule order Tally documents.

The first matching rule wins. Matching is case-insensitive, as in GA4.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vocabulary import UNATTRIBUTED

DIRECT = "Direct"

CHANNELS = (
    "Direct", "Cross-network", "Paid Shopping", "Paid Search", "Paid Social", "Paid Video",
    "Display", "Paid Other", "Organic Shopping", "Organic Social", "Organic Video",
    "AI Assistants", "Organic Search", "Email", "Affiliates", "Referral", "Audio", "SMS",
    "Mobile Push Notifications",
)
ALL_CHANNELS = (*CHANNELS, UNATTRIBUTED)

PAID_MEDIUM = re.compile(r"^(.*cp.*|ppc|retargeting|paid.*)$")
SHOPPING_CAMPAIGN = re.compile(r"^(.*(([^a-df-z]|^)shop|shopping).*)$")
DISPLAY_MEDIUMS = frozenset({"display", "banner", "expandable", "interstitial", "cpm"})
SOCIAL_MEDIUMS = frozenset({"social", "social-network", "social-media", "sm", "social network",
                            "social media"})
EMAIL_NAMES = frozenset({"email", "e-mail", "e_mail", "e mail"})
REFERRAL_MEDIUMS = frozenset({"referral", "app", "link"})
_NONE_SOURCES = frozenset({"", "(direct)", "(none)", "(not set)"})
_NONE_MEDIUMS = frozenset({"", "(none)", "(not set)"})
_GOOGLE = re.compile(r"^(www\.)?google(\.[a-z]{2,3}){0,2}$")
_BING = re.compile(r"^(www\.)?bing(\.[a-z]{2,3}){0,2}$")
_GOOGLE_CLICK_IDS = frozenset({"gclid", "gbraid", "wbraid"})


def classify_channel(
    source: str | None,
    medium: str | None = None,
    campaign: str | None = None,
    click_ids: Iterable[str] = (),
    category: str | None = None,
) -> str:
    """One of CHANNELS for a session's first event.

    category is the source's category from attribution.sources (search, social, video,
    shopping, ai) or None. click_ids names the click-id parameters present.
    """
    source = (source or "").strip().lower()
    medium = (medium or "").strip().lower()
    campaign = (campaign or "").strip().lower()
    if source in _NONE_SOURCES:
        source = ""
    if medium in _NONE_MEDIUMS:
        medium = ""
    clicks = set(click_ids)
    # Auto-tagged ad clicks: gclid/gbraid/wbraid from Google, msclkid from Bing.
    paid_click = bool(
        (clicks & _GOOGLE_CLICK_IDS and _GOOGLE.match(source))
        or ("msclkid" in clicks and _BING.match(source))
    )
    paid = paid_click or bool(PAID_MEDIUM.match(medium))
    shopping_campaign = bool(SHOPPING_CAMPAIGN.match(campaign))

    if not source and not medium:
        return DIRECT
    if "cross-network" in campaign:
        return "Cross-network"
    if (category == "shopping" or shopping_campaign) and paid:
        return "Paid Shopping"
    if paid_click or (category == "search" and paid):
        return "Paid Search"
    if category == "social" and "fbclid" in clicks:
        return "Paid Social" if paid else "Organic Social"
    if category == "social" and paid:
        return "Paid Social"
    if category == "video" and paid:
        return "Paid Video"
    if medium in DISPLAY_MEDIUMS:
        return "Display"
    if paid:
        return "Paid Other"
    if category == "shopping" or shopping_campaign:
        return "Organic Shopping"
    if category == "social" or medium in SOCIAL_MEDIUMS:
        return "Organic Social"
    if category == "video" or "video" in medium:
        return "Organic Video"
    if category == "ai":
        return "AI Assistants"
    if category == "search" or medium == "organic":
        return "Organic Search"
    if (source in EMAIL_NAMES or medium in EMAIL_NAMES
            or "newsletter" in source or "newsletter" in medium):
        return "Email"
    if medium == "affiliate":
        return "Affiliates"
    if medium in REFERRAL_MEDIUMS:
        return "Referral"
    if medium == "audio":
        return "Audio"
    if source == "sms" or medium == "sms":
        return "SMS"
    if (medium.endswith("push") or "mobile" in medium or "notification" in medium
            or source == "firebase"):
        return "Mobile Push Notifications"
    # Left over: with a source it is a referral; a medium alone (GA4's "Unassigned", a
    # name outside Tally's list) came with no source, so it is a direct visit.
    return "Referral" if source else DIRECT
