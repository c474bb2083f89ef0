"""The Funnels page in real headless Chromium against a real gunicorn: save a funnel by the
form, read what it draws against the Stats API, delete one, at 390 and 1440 pixels with no
console error and nothing wider than the window; screenshots under var/screenshots/."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from decimal import Decimal

import orjson
import pytest

from tests import dashboard_seed as seed
from tests.conftest import bearer, http, wait_until
from tests.test_dashboard_browser import (  # noqa: F401 - fixtures
    api,
    browser,
    console_errors,
    served,
    shoot,
    wait_for_url,
)
from tests.test_dashboard_browser import wait_until as wait_in_browser

pytestmark = [pytest.mark.slow, pytest.mark.browser]
STEPS = "page:/\npage:/features\ngoal:signup\npayment"


def pay_after_the_signups(server, world) -> None:
    """The seed's payments came before its signups: one customer pays again, after."""
    after = math.ceil(time.time()) + 1
    assert wait_until(lambda: time.time() > after)
    payment = {"payment_id": "pay_again", "amount": 20, "currency": "EUR", "kind": "charge",
               "paid_at": datetime.fromtimestamp(after, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "customer": {"id": "cus_1", "user_id": "u-1"}}
    status, _, body = http("POST", server.url + "/api/v1/payments", orjson.dumps(payment),
                           headers={**bearer(world["a"]["key"]),
                                    "Content-Type": "application/json"})
    assert status == 200, body


def test_the_funnels_page_in_chromium(served, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    server, world = served
    driver = browser
    site = world["a"]["site"]
    pay_after_the_signups(server, world)
    driver.get(server.url + f"/sites/{site}/funnels")
    driver.find_element(By.ID, "email").send_keys(world["a"]["email"])
    driver.find_element(By.ID, "password").send_keys(seed.PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    wait_for_url(driver, server.url + f"/sites/{site}/funnels")
    assert "No saved funnels yet." in driver.page_source
    assert console_errors(driver) == []

    driver.find_element(By.ID, "funnel-name").send_keys("Signup to paid")
    driver.find_element(By.ID, "funnel-steps").send_keys(STEPS)
    driver.find_element(By.CSS_SELECTOR, "form.funnel-form button").click()
    wait_in_browser(driver, lambda d: "funnel=Signup+to+paid" in d.current_url, "not saved")

    start = driver.find_element(By.ID, "from").get_attribute("value")
    end = driver.find_element(By.ID, "to").get_attribute("value")
    expected = api(server, world, f"/api/v1/stats/funnel?funnel=Signup%20to%20paid"
                                  f"&from={start}&to={end}")
    steps = driver.find_elements(By.CSS_SELECTOR, "li.funnel-step")
    assert [(s.get_attribute("data-step"), int(s.get_attribute("data-visitors")))
            for s in steps] == [(s["step"], s["visitors"]) for s in expected["steps"]]
    assert expected["steps"][-1]["visitors"] == 1
    revenue = driver.find_element(By.CSS_SELECTOR, "#funnel-revenue li[data-currency='EUR']")
    assert Decimal(revenue.get_attribute("data-net")) == Decimal(
        str(expected["revenue"]["EUR"]["net"]))
    # The bars are as long as each step's share of the first.
    widths = [float(r.get_attribute("width")) for r in driver.find_elements(
        By.CSS_SELECTOR, "li.funnel-step rect.bar-fill")]
    assert widths == [round(s["conversion_rate"] * 100, 2) for s in expected["steps"]]
    for width in (390, 1440):
        driver.set_window_size(width, 900)
        assert driver.execute_script(
            "return document.documentElement.scrollWidth") <= width, f"wider than {width}"
    assert console_errors(driver) == []
    shoot(driver, "funnels")

    # Delete behind its confirmation.
    driver.find_element(By.CSS_SELECTOR, "li[data-funnel='Signup to paid'] summary").click()
    driver.find_element(By.CSS_SELECTOR, "li[data-funnel='Signup to paid'] form button").click()
    wait_in_browser(driver, lambda d: "No saved funnels yet." in d.page_source, "not deleted")
    assert console_errors(driver) == []
