"""The dashboard in real headless Chromium against a real gunicorn: sign in, read the top
figures and compare them with the Stats API, filter by a channel row, create and revoke a
key, open a shared link, check the console, and save screenshots at 390 and 1440 pixels,
light and dark, under var/screenshots/ (not committed: look at them)."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from app import create_app
from tests import dashboard_seed as seed
from tests.conftest import REPO, WAIT, Server, bearer, cli_json, config_for, http
from tests.realparts import require

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS = REPO / "var" / "screenshots"
WIDTHS = (390, 1440)


@pytest.fixture
def served(db_path):
    require("chromium", "/usr/bin/chromium")
    require("chromedriver", "/usr/bin/chromedriver")
    db = db_path
    world = seed.users(db)
    tally = create_app(config_for(db))
    seed.traffic(tally, world["a"], time.time())
    tally.stop(timeout=5)
    world["share"] = cli_json("share", "create", "--site", world["a"]["site"], db=db)["url"]
    # Threads: Chromium keeps idle (pre)connections open, which would hold a sync worker.
    server = Server(db, workers=1, env={"GUNICORN_CMD_ARGS": "--worker-class gthread --threads 4"}
                    ).wait_ready()
    yield server, world
    server.stop()


@pytest.fixture
def browser(served, chromium):
    chromium.set_window_size(1440, 900)
    chromium.implicitly_wait(WAIT)  # a page reached by a click may still be loading
    return chromium


def api(server, world, path):
    status, _, body = http("GET", server.url + path, headers=bearer(world["a"]["key"]))
    assert status == 200, body
    return orjson.loads(body)["data"]


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


# The charts redraw 50 ms after a resize, at their container's width (dashboard.js).
CHARTS_FIT = """return Array.from(document.querySelectorAll('.uplot')).every(function (chart) {
  var wrap = chart.querySelector('.u-wrap');
  var width = Math.max(280, chart.parentElement.clientWidth);
  return wrap && Math.abs(wrap.getBoundingClientRect().width - width) < 1;
});"""


def shoot(driver, name: str) -> None:
    """Full-page screenshots at both widths, light and dark."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": scheme}]})
        for width in WIDTHS:
            driver.set_window_size(width, 900)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(width, min(max(height, 600), 5000))
            wait_until(driver, lambda d: d.execute_script(CHARTS_FIT), "charts not redrawn")
            driver.save_screenshot(str(SHOTS / f"{name}-{width}-{scheme}.png"))
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    driver.set_window_size(1440, 900)


def wait_until(driver, condition, message: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, WAIT).until(condition, message)


def wait_for_url(driver, url: str) -> None:
    wait_until(driver, lambda d: d.current_url == url, f"not at {url}")


def metrics(driver) -> dict[str, str]:
    from selenium.webdriver.common.by import By
    return {e.get_attribute("data-metric"): e.get_attribute("data-value")
            for e in driver.find_elements(By.CSS_SELECTOR, "[data-metric]")}


def test_the_dashboard_in_chromium(served, browser):
    from selenium.webdriver.common.by import By

    server, world = served
    driver = browser
    site = world["a"]["site"]

    driver.get(server.url + f"/sites/{site}")
    assert "/login" in driver.current_url
    shoot(driver, "login")
    driver.find_element(By.ID, "email").send_keys(world["a"]["email"])
    driver.find_element(By.ID, "password").send_keys(seed.PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    wait_for_url(driver, server.url + f"/sites/{site}")

    driver.get(server.url + f"/sites/{site}?period=7d")
    shown = metrics(driver)
    start = driver.find_element(By.ID, "from").get_attribute("value")
    end = driver.find_element(By.ID, "to").get_attribute("value")
    aggregate = api(server, world, f"/api/v1/stats/aggregate?from={start}&to={end}")
    revenue = api(server, world, f"/api/v1/stats/revenue?from={start}&to={end}")
    mrr = api(server, world, f"/api/v1/stats/mrr?at={end}")
    assert aggregate["visitors"] == 6
    assert int(shown["visitors"]) == aggregate["visitors"]
    assert int(shown["pageviews"]) == aggregate["pageviews"]
    assert float(shown["bounce_rate"]) == aggregate["bounce_rate"]
    assert float(shown["visit_duration"]) == aggregate["avg_session_seconds"]
    net = Decimal(str(revenue["currencies"]["EUR"]["net"]))
    assert Decimal(shown["revenue"]) == net == 167
    assert Decimal(shown["mrr"]) == Decimal(str(mrr["currencies"]["EUR"]["mrr"]))
    assert Decimal(shown["revenue_per_visitor"]) == (net / 6).quantize(Decimal("0.01"))
    if driver.execute_script("return !!document.getElementById('chart-data')"):
        assert driver.find_elements(By.CSS_SELECTOR, "#chart .uplot canvas")
    if driver.execute_script("return !!document.getElementById('live')"):
        realtime = api(server, world, "/api/v1/stats/realtime")
        wait_until(driver, lambda d: d.find_element(By.ID, "live-count").text
                   == str(realtime["visitors"]), "the live count did not load")
    assert console_errors(driver) == []
    shoot(driver, "dashboard")

    # Keyboard: the period picker's links are reachable and followable without a mouse.
    link = driver.find_element(By.LINK_TEXT, "30 days")
    link.send_keys("\n")
    wait_until(driver, lambda d: "period=30d" in d.current_url, "the period did not change")

    row = driver.find_element(By.CSS_SELECTOR, 'tr[data-channel="Organic Search"] a')
    row.click()
    wait_until(driver, lambda d: "filters=channel%3D%3DOrganic+Search" in d.current_url,
               "not filtered")
    chips = driver.find_element(By.CSS_SELECTOR, ".filters").text
    assert "Organic Search" in chips
    note = driver.execute_script(
        "var n = document.querySelector('aside.note'); return n ? n.textContent : '';")
    if "filters=" not in note:
        assert int(metrics(driver)["visitors"]) == 2
    assert console_errors(driver) == []
    shoot(driver, "dashboard-filtered")

    driver.get(server.url + f"/sites/{site}/revenue")
    assert Decimal(metrics(driver)["mrr"]) == 167
    assert console_errors(driver) == []
    shoot(driver, "revenue")

    driver.get(server.url + f"/sites/{site}/settings")
    for box in driver.find_elements(By.CSS_SELECTOR, "input[name=scope]"):
        if box.get_attribute("value") == "payments":
            box.click()
    driver.find_element(By.CSS_SELECTOR, "form.new-key button").click()
    secret = wait_until(driver, lambda d: d.find_elements(By.ID, "new-key-secret"),
                        "no new key shown")[0].get_attribute("value")
    status, _, body = http("GET", server.url + "/api/v1/key", headers=bearer(secret))
    assert status == 200
    key_id = orjson.loads(body)["data"]["id"]
    assert sorted(orjson.loads(body)["data"]["scopes"]) == ["payments", "read"]
    shoot(driver, "settings-new-key")
    driver.find_element(By.CSS_SELECTOR, f'tr[data-key="{key_id}"] button').click()
    wait_until(driver, lambda d: d.find_elements(
        By.CSS_SELECTOR, f'tr[data-key="{key_id}"][data-revoked="yes"]'), "key not revoked")
    assert secret not in driver.page_source
    time.sleep(1.1)  # the API caches a key for at most one second
    assert http("GET", server.url + "/api/v1/key", headers=bearer(secret))[0] == 401
    assert console_errors(driver) == []

    driver.find_element(By.CSS_SELECTOR, "form[action='/logout'] button").click()
    wait_until(driver, lambda d: "/login" in d.current_url, "not signed out")
    driver.get(server.url + world["share"] + "?period=7d")
    shared = metrics(driver)
    assert int(shared["visitors"]) == 6 and "revenue" not in shared
    assert console_errors(driver) == []
    shoot(driver, "shared")
    assert len(list(Path(SHOTS).glob("*.png"))) >= 24
