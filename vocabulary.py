"""Words and numbers several layers share, defined once.

This module imports nothing of Tally's, so every layer may import it (tests/test_layers.py).
Tuning values that an operator might change (TTLs, cache sizes, timeouts) live in
config.Config instead; what is here is fixed by the spec or by the data model.
"""

from __future__ import annotations

DAY_MS = 86_400_000
HOUR_MS = 3_600_000

# A dated visitor id (a daily ip + ua one under a dated salt, or a browser id of the dated
# shape): bit 63 clear, bits 48..62 `1 + day % DAY_PERIOD` (never 0, so no id is 0, the
# erased visitor's), bits 0..47 a keyed hash. One day's new visitors fall in one range of
# the (site_id, visitor_id) index.
DAY_SHIFT = 48  # a dated id's hash bits
DAY_PERIOD = 2**15 - 1  # a dated id's day field holds 1 + day % DAY_PERIOD


def day_bits(day: int) -> int:
    """The high bits of every dated id of UTC `day` (days since 1970)."""
    return (1 + day % DAY_PERIOD) << DAY_SHIFT


# Event names with a meaning of their own; any other name is a custom event.
PAGEVIEW = "pageview"
IDENTIFY = "$identify"  # links a uid to the visitor; opens no session
# Names the monthly quota does not count when sent with a key (quota.usage.counted_events);
# every event of the public POST /api/v1/collect counts.
UNCOUNTED_EVENTS = (IDENTIFY,)

# An event's `ts` is kept when it lies within [receipt - TS_PAST_MS, receipt + TS_FUTURE_MS]
# (spec: Events, field ts); otherwise the receipt time replaces it.
TS_PAST_MS = HOUR_MS
TS_FUTURE_MS = 60_000

# A visitor's events with gaps of at most this long form one session.
SESSION_GAP_MS = 30 * 60 * 1000

# Campaign parameters read from a page URL's query, in the order the events table stores them.
UTM_KEYS = ("utm_source", "utm_medium", "utm_campaign", "utm_term", "utm_content")
CLICK_IDS = ("gclid", "gbraid", "wbraid", "msclkid", "fbclid")
CAMPAIGN_PARAMS = UTM_KEYS + CLICK_IDS

# The channel of a customer (or payment) no session is linked to.
UNATTRIBUTED = "Unattributed"

# Plans an account may be on; their allowances and caps are quota.plans.PLANS.
PLAN_NAMES = ("free", "starter", "growth", "scale")

# What an API key may be allowed to do.
SCOPES = ("events", "payments", "read")
