"""POST /api/v1/payments: one payment, validated, committed to disk before the 200."""

from __future__ import annotations

import logging

import falcon

import metrics
from api.auth import Authenticator, key_scope
from api.bodies import parse_json, read_limited
from api.errors import ApiError, invalid_input, rate_limited
from storage.db import StorageBusy, StorageError
from storage.payments import PaymentStore
from validation.payment import PaymentInputError, validate_payment

PAYMENT_BODY_LIMIT = 65_536  # 64 KiB

log = logging.getLogger("tally")


class PaymentsResource:
    def __init__(self, auth: Authenticator, store: PaymentStore):
        self.auth = auth
        self.store = store

    @falcon.before(key_scope("payments"))
    def on_post(self, req, resp):
        key = req.context.key
        body = parse_json(read_limited(req, PAYMENT_BODY_LIMIT))
        try:
            payment = validate_payment(body)
        except PaymentInputError as exc:
            raise invalid_input(str(exc)) from None
        try:
            self.store.upsert(key.site_id, payment)
        except StorageBusy:
            raise rate_limited("the database is busy; retry after 2 seconds") from None
        except StorageError as exc:
            # The payment ids are the caller's own references, not secrets.
            log.error("storing payment %s for site %s failed: %s", payment.payment_id,
                      key.site_public_id, exc)
            raise ApiError(500, "internal_error", "the payment could not be stored; retry later") from None
        metrics.payment_upserted()
        resp.media = {"ok": True, "data": {"payment_id": payment.payment_id}}
