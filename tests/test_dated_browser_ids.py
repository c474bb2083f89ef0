"""Browser ids of two shapes (storage/browser_ids.py), on both engines: the dated one the
script writes for a new browser (`dddd.` and 32 hex digits, dddd its UTC day) is stored as
a dated id of that day; the undated one every older cookie keeps (32 hex digits) is
stored under the 64-bit hash it always had. Both go through collect's `v`, a payment's
`customer.visitor_id`, a restart and `tally visitor erase --visitor`.
"""

from __future__ import annotations

import orjson
import pytest
import webtest

from app import create_app
from enrichment.browser_ids import browser_visitor_id, is_browser_id
from tests.conftest import WAIT, bearer, cli_json, config_for, rows
from tests.test_collect_http import browser_key, collect, hit, site_int_id

KEY = bytes(range(32))
UNDATED = "0123456789abcdef0123456789abcdef"
COOKIE_DAY = 20_717  # 2026-09-21, the FakeClock's day
DATED = f"{COOKIE_DAY:04x}." + "fedcba9876543210fedcba9876543210"


def test_an_undated_cookie_keeps_its_id_and_a_dated_one_carries_its_day():
    # What every cookie the script wrote before it dated them was stored under: pinned.
    assert browser_visitor_id(KEY, 1, UNDATED) == 2_339_404_504_760_222_021
    assert browser_visitor_id(KEY, 7, "fedcba9876543210fedcba9876543210") == (
        5_797_263_282_159_398_734)
    dated = browser_visitor_id(KEY, 1, DATED)
    assert dated == 5_831_670_438_161_727_543
    assert dated >> 48 == 1 + COOKIE_DAY % 32_767
    for day, high in ((0, 1), (0x7ffe, 0x7fff), (0x7fff, 1), (0xffff, 2)):
        # Any 16-bit day is valid, and no id is 0 (the erased visitor's) or negative.
        assert browser_visitor_id(KEY, 1, f"{day:04x}.{UNDATED}") >> 48 == high
    # The day is part of what is hashed, and the shapes never share a formula.
    assert browser_visitor_id(KEY, 1, f"{COOKIE_DAY + 1:04x}.{UNDATED}") & (2**48 - 1) != (
        browser_visitor_id(KEY, 1, f"{COOKIE_DAY:04x}.{UNDATED}") & (2**48 - 1))
    assert browser_visitor_id(KEY, 1, DATED) != browser_visitor_id(KEY, 1, DATED[5:])
    assert browser_visitor_id(KEY, 2, DATED) != dated


@pytest.mark.parametrize(("value", "accepted"), [
    (UNDATED, True), (DATED, True), ("ffff." + "0" * 32, True), ("0000." + "f" * 32, True),
    (DATED.upper(), False), (DATED.replace(".", ""), False), (DATED.replace(".", ":"), False),
    (DATED[1:], False), (DATED + "0", False), ("50ed." + "0" * 31, False),
    ("." + UNDATED, False), (UNDATED + ".50ed", False), ("50ed.50ed." + UNDATED, False),
    ("50ed." + UNDATED + "\n", False), (20_717, False), (None, False)])
def test_both_shapes_are_browser_ids_and_nothing_else(value, accepted):
    assert is_browser_id(value) is accepted


def test_both_shapes_through_collect_payments_a_restart_and_erase(
        client, tally, site, clock, db_path):
    public_id = site["site"]["id"]
    number = site_int_id(db_path, public_id)
    tally.start()
    assert collect(client, hit(public_id, v=DATED, u="https://example.com/?gclid=abc"),
                   peer="203.0.113.9").status_int == 204
    assert collect(client, hit(public_id, v=UNDATED, u="https://example.com/?utm_source=news"
                               "&utm_medium=email"), peer="198.51.100.4").status_int == 204
    assert tally.flusher.flush_now(timeout=WAIT)
    key = browser_key(db_path)
    dated, undated = browser_visitor_id(key, number, DATED), browser_visitor_id(key, number, UNDATED)
    assert dated >> 48 == 1 + COOKIE_DAY % 32_767
    stored = rows(db_path, "SELECT visitor_id FROM events ORDER BY id")
    assert [r["visitor_id"] for r in stored] == [dated, undated]

    clock.advance(21 * 86_400)  # three weeks later, direct visits, then the purchase
    assert collect(client, hit(public_id, v=DATED), peer="192.0.2.50").status_int == 204
    assert tally.flusher.flush_now(timeout=WAIT)
    payment = {"payment_id": "pay_1", "amount": 49, "currency": "USD", "kind": "charge",
               "status": "succeeded", "paid_at": "2026-10-12T15:00:00Z",
               "customer": {"id": "cus_1", "visitor_id": DATED}}
    assert client.post("/api/v1/payments", orjson.dumps(payment), headers=bearer(site["key"]),
                       content_type="application/json").status_int == 200
    record = client.get("/api/v1/customers/cus_1", headers=bearer(site["key"])).json["data"]
    assert record["visitor_id"] == str(dated)
    assert record["attribution"]["channel"] == "Paid Search"
    assert record["attribution"]["first_seen"] == "2026-09-21T14:13:20.000Z"
    tally.stop(timeout=5)

    restarted = create_app(config_for(db_path), clock=clock)
    try:
        restarted.start()
        app = webtest.TestApp(restarted)
        clock.advance(3600)
        for browser in (UNDATED, DATED):
            assert collect(app, hit(public_id, v=browser, u="https://example.com/again")
                           ).status_int == 204
        assert restarted.flusher.flush_now(timeout=WAIT)
        again = rows(db_path, "SELECT visitor_id FROM events WHERE pathname = '/again'"
                              " ORDER BY id")
        assert [r["visitor_id"] for r in again] == [undated, dated]
        record = app.get("/api/v1/customers/cus_1", headers=bearer(site["key"])).json["data"]
        assert record["attribution"]["channel"] == "Paid Search"
    finally:
        restarted.stop(timeout=5)

    for browser, visitor, events in ((DATED, dated, 3), (UNDATED, undated, 2)):
        result = cli_json("visitor", "erase", "--site", public_id, "--visitor", browser,
                          db=db_path)
        assert result["events"] == events
        assert rows(db_path, "SELECT 1 FROM events WHERE visitor_id = ?", (visitor,)) == []
    assert rows(db_path, "SELECT 1 FROM events") == []
    assert cli_json("check", db=db_path)["ok"]
