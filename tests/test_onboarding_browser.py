"""The first run in real headless Chromium against a real `tally serve`: the welcome page,
the setup link from the server's one line, the setup form, the install check turning to
receiving without a reload, a shared link, a new site, people and an invitation, and the
removal page. Each page is checked for console errors and overflow at 390 and 1440 px and
saved as full-page screenshots, light and dark, under var/screenshots/ (not committed: look at them);
docs/screenshots/ holds the setup and settings pages of one such run."""

from __future__ import annotations

import os
import re
import subprocess

import orjson
import pytest

from tests import dashboard_seed as seed
from tests.conftest import (
    BIN,
    REPO,
    SERVER_ENV,
    WAIT,
    _without_database,
    bearer,
    cli_json,
    database_env,
    free_port,
    http,
    stop_process,
    wait_until,
)
from tests.realparts import require

pytestmark = [pytest.mark.slow, pytest.mark.browser]
SHOTS = REPO / "var" / "screenshots"
WIDTHS = (390, 1440)
PASSWORD = "a long enough password"


class TallyServe:
    """`tally serve` as an operator runs it, its output in a file."""

    def __init__(self, db: str, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(BIN / "tally"), "serve", "--bind", f"127.0.0.1:{self.port}", "--workers", "2"],
            cwd=REPO, env={**_without_database(os.environ), **SERVER_ENV, **database_env(db)},
            stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> TallyServe:
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"tally serve exited: {self.log()}")
            return http("GET", self.url + "/healthz")[0] == 200 if self._listening() else False
        assert wait_until(answers), self.log()
        return self

    def _listening(self) -> bool:
        import socket
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> int:
        status = stop_process(self.proc)
        self._log.close()
        return status


@pytest.fixture
def served(db_path, tmp_path):
    require("chromium", "/usr/bin/chromium")
    require("chromedriver", "/usr/bin/chromedriver")
    server = TallyServe(db_path, tmp_path / "serve.log").wait_ready()
    yield server
    server.stop()


@pytest.fixture
def browser(served, chromium):
    chromium.set_window_size(1440, 900)
    return chromium


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def until(driver, condition, message: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, WAIT).until(condition, message)


def look(driver, name: str) -> None:
    """At both widths, light and dark: nothing wider than the window, a full-page
    screenshot; and no console error."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": scheme}]})
        for width in WIDTHS:
            driver.set_window_size(width, 900)
            # Charts redraw at their new width 50 ms after a resize (dashboard.js).
            until(driver, lambda d: d.execute_script(
                "return document.documentElement.scrollWidth"
                " <= document.documentElement.clientWidth"), f"{name} is wider than {width} px")
            height = driver.execute_script("return document.documentElement.scrollHeight"
                                           " + window.outerHeight - window.innerHeight")
            driver.set_window_size(width, min(max(height, 600), 5000))
            suffix = "" if scheme == "light" else "-dark"
            driver.save_screenshot(str(SHOTS / f"{name}-{width}{suffix}.png"))
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    driver.set_window_size(1440, 900)
    assert console_errors(driver) == [], name


def test_the_first_run_in_chromium(served, browser, db_path):
    from selenium.webdriver.common.by import By

    server, driver = served, browser
    log = server.log()
    assert log.count("no user yet") == 1, log
    setup_url = re.search(r"Open (\S+) within 24 hours", log).group(1)

    driver.get(server.url + "/")
    assert "tally setup-link" in driver.find_element(By.TAG_NAME, "main").text
    look(driver, "welcome")

    driver.get(setup_url)
    look(driver, "setup")
    driver.find_element(By.ID, "email").send_keys("owner@shop.example")
    driver.find_element(By.ID, "password").send_keys(PASSWORD)
    driver.find_element(By.ID, "host").send_keys("shop.example")
    driver.find_element(By.ID, "account").send_keys("Shop")
    driver.find_element(By.CSS_SELECTOR, "form[data-form=setup] button").click()
    until(driver, lambda d: "/settings?welcome=1" in d.current_url, "setup did not finish")
    site = re.search(r"/sites/(site_[a-z0-9]+)/", driver.current_url).group(1)
    snippet = driver.find_element(By.ID, "snippet").get_attribute("value")
    assert f'data-site="{site}"' in snippet and "/js/tally.js" in snippet
    check = driver.find_element(By.CSS_SELECTOR, "[data-install]")
    assert check.get_attribute("data-install") == "waiting"
    look(driver, "settings-waiting")

    # The first event, sent while the page is open: the line turns by itself.
    driver.execute_script("window.notReloaded = true;")
    key = cli_json("key", "create", "--site", site, "--scope", "events", db=db_path)["key"]
    status, _, body = http("POST", server.url + "/api/v1/events", orjson.dumps(
        {"s": site, "e": "pageview", "u": "https://shop.example/", "ip": "203.0.113.9",
         "ua": seed.UA}), {**bearer(key), "Content-Type": "application/json"})
    assert status == 204, body
    until(driver, lambda d: d.find_element(By.CSS_SELECTOR, "[data-install]")
          .get_attribute("data-install") == "receiving", "the install check did not turn")
    assert driver.execute_script("return window.notReloaded === true")
    assert "Receiving events" in driver.find_element(By.ID, "script-seen").text

    # A shared link with revenue, made and shown once.
    driver.find_element(By.CSS_SELECTOR, "form[action$='/settings/shares'] input[name=revenue]").click()
    driver.find_element(By.CSS_SELECTOR, "form[action$='/settings/shares'] button").click()
    share = until(driver, lambda d: d.find_elements(By.ID, "new-share-url"),
                  "no shared link shown")[0].get_attribute("value")
    assert http("GET", share)[0] == 200
    look(driver, "settings")

    # Another site, from the list of sites.
    driver.get(server.url + "/")
    driver.find_element(By.ID, "new-host").send_keys("blog.shop.example")
    driver.find_element(By.CSS_SELECTOR, "form[action='/sites'] button").click()
    until(driver, lambda d: "/settings?welcome=1" in d.current_url and site not in d.current_url,
          "the new site did not open")
    driver.get(server.url + "/")
    assert "blog.shop.example" in driver.find_element(By.TAG_NAME, "main").text
    look(driver, "home")

    # People: an invitation link for a viewer.
    driver.find_element(By.LINK_TEXT, "People").click()
    until(driver, lambda d: "/people" in d.current_url, "no people page")
    driver.find_element(By.CSS_SELECTOR, "form[action$='/invitations'] button").click()
    invitation = until(driver, lambda d: d.find_elements(By.ID, "invitation-url"),
                       "no invitation shown")[0].get_attribute("value")
    look(driver, "people")

    driver.get(server.url + f"/sites/{site}/remove")
    look(driver, "remove-site")

    driver.delete_all_cookies()
    driver.get(invitation)
    look(driver, "invitation")
    driver.find_element(By.ID, "email").send_keys("viewer@shop.example")
    driver.find_element(By.ID, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "form[data-form=invitation] button").click()
    until(driver, lambda d: d.current_url == server.url + "/", "the invitation was not taken")
    driver.get(server.url + f"/sites/{site}")
    tabs = driver.find_element(By.CSS_SELECTOR, "nav.tabs").text
    assert "Settings" not in tabs and "Revenue" in tabs
    look(driver, "dashboard-viewer")
    driver.get(server.url + f"/sites/{site}/settings")
    assert "Not allowed" in driver.title
    assert server.stop() == 0
