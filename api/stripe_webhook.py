"""POST /api/v1/integrations/stripe/{site_id}: Stripe webhook events, verified and applied.

Checked in this order: size (413), the site's signing secret (400 when the site has
none), the Stripe-Signature header by the official `stripe` library with a 300 s
tolerance on both sides (400: the library refuses only old timestamps, so one from the
future is refused here), the event (400), then the writes it maps to, committed with the
event's id before the 200 (503 while the database stays locked). A redelivered event
and a type Tally does not use are answered 200 without writing anything.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

import metrics
from api.bodies import parse_json, read_limited
from api.errors import ApiError, invalid_input, rate_limited
from storage.db import StorageBusy, StorageError
from storage.directory import Directory
from storage.stripe import StripeStore
from validation.stripe import UnusableEvent, map_event

# Stripe's own events stay far below this; an invoice with hundreds of lines is ~500 KB.
STRIPE_BODY_LIMIT = 1_048_576
SIGNATURE_TOLERANCE_SECONDS = 300

log = logging.getLogger("tally")


class IgnoredTypes:
    """Event types received but not used, counted per worker for the logs."""

    def __init__(self):
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, event_type: str) -> int:
        with self._lock:
            self._counts[event_type] += 1
            return self._counts[event_type]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class StripeWebhook:
    def __init__(self, directory: Directory, store: StripeStore):
        self.directory = directory
        self.store = store
        self.ignored = IgnoredTypes()

    def on_post(self, req, resp, site_id: str):
        payload = read_limited(req, STRIPE_BODY_LIMIT)
        site = self.directory.find_site(site_id)
        secret = self.store.secret(site.id) if site is not None else None
        if secret is None:
            raise invalid_input(f"no Stripe webhook secret is set for site {site_id[:64]}")
        _verify(payload, req.get_header("Stripe-Signature"), secret)
        try:
            mapped = map_event(parse_json(payload))
        except UnusableEvent as exc:
            raise invalid_input(str(exc)) from None
        if not mapped.handled:
            metrics.stripe_event("ignored", mapped.type)
            count = self.ignored.add(mapped.type)
            log.info("stripe: ignored event type %s for site %s (%d of this type in this worker)",
                     mapped.type[:80], site_id, count)
            resp.media = {"ok": True, "data": {"id": mapped.event_id, "status": "ignored"}}
            return
        try:
            applied = self.store.apply(site.id, mapped)
        except StorageBusy:
            raise rate_limited("the database is busy; retry after 2 seconds") from None
        except StorageError as exc:
            log.error("storing Stripe event %s for site %s failed: %s", mapped.event_id,
                      site_id, exc)
            raise ApiError(500, "internal_error", "the event could not be stored; retry later") from None
        status = "applied" if applied else "duplicate"
        metrics.stripe_event(status, mapped.type)
        resp.media = {"ok": True, "data": {"id": mapped.event_id, "status": status}}


def _verify(payload: bytes, header: str | None, secret: str,
            now: Callable[[], float] = time.time) -> None:
    """The library's check (HMAC-SHA256 of "t.payload", constant-time compare, tolerance);
    its messages carry no secret, but the answer uses fixed texts of our own. `now` is the
    machine's clock, as the library's own."""
    if not header:
        raise invalid_input("missing Stripe-Signature header")
    # Imported on the first webhook: stripe and requests take ~6 MiB a worker, and most
    # workers never receive one.
    import stripe

    try:
        stripe.WebhookSignature.verify_header(payload, header, secret,
                                              tolerance=SIGNATURE_TOLERANCE_SECONDS)
    except stripe.SignatureVerificationError as exc:
        if "tolerance" in str(exc):
            raise invalid_input("Stripe-Signature timestamp is more than "
                                f"{SIGNATURE_TOLERANCE_SECONDS} seconds old") from None
        raise invalid_input("Stripe-Signature does not match this site's webhook secret") from None
    except (UnicodeDecodeError, ValueError):
        raise invalid_input("Stripe-Signature does not match this site's webhook secret") from None
    if _signed_at(header) > now() + SIGNATURE_TOLERANCE_SECONDS:
        raise invalid_input("Stripe-Signature timestamp is more than "
                            f"{SIGNATURE_TOLERANCE_SECONDS} seconds in the future")


def _signed_at(header: str) -> int:
    """The header's first `t=`, read as the library has just read it."""
    items = [item.split("=", 2) for item in header.split(",")]
    return int(next(item[1] for item in items if item[0] == "t"))
