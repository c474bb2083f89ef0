"""Real parts the machine may lack: headless Chromium (through Debian's chromium and
chromium-driver), nginx and pgbouncer. `make test` installs them when it can (scripts/system-deps.sh).
A test that needs one skips loudly when it is missing, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

DESKTOP_UA = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
              "Chrome/130.0.0.0 Safari/537.36")


def require(tool: str, *candidates: str) -> str:
    """The path of `tool`, or skip (fail under CI=true) with a loud message."""
    for name in (tool, *candidates):
        path = shutil.which(name) or (name if os.path.isabs(name) and os.access(name, os.X_OK)
                                      else None)
        if path:
            return path
    message = (f"*** {tool} is not installed: this real-part test cannot run. "
               f"`make test` installs it as root (scripts/system-deps.sh). ***")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def chromium_driver(*, host_rules: str = "MAP *.test 127.0.0.1", user_agent: str = DESKTOP_UA,
                    width: int = 1280, height: int = 900, extra_args: tuple[str, ...] = ()):
    """A headless Debian Chromium driven through its own chromedriver; the caller quits it.

    `host_rules` maps test hostnames (e.g. shop.test) to loopback, so pages are served
    from a hostname that is not local."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = require("chromium", "/usr/bin/chromium")
    driver_path = require("chromedriver", "/usr/bin/chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={tempfile.mkdtemp(prefix='tally-chromium-')}",
                f"--host-resolver-rules={host_rules}", f"--user-agent={user_agent}",
                f"--window-size={width},{height}", *extra_args):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # A slow start is waited for (chromedriver's default is 60 s); selenium's own wait for
    # the answer is 120 s.
    options.add_experimental_option("browserStartupTimeout", 110_000)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))


POSTGRES_URL = os.environ.get("TALLY_TEST_DATABASE_URL",
                              "postgresql://postgres@127.0.0.1:5432/test")


def postgres_admin():
    """A connection to the test server, or skip (fail under CI=true) with a loud message."""
    import psycopg

    try:
        return psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=20)
    except psycopg.OperationalError as exc:
        message = (f"*** no PostgreSQL answers at TALLY_TEST_DATABASE_URL={POSTGRES_URL}"
                   f" ({str(exc).strip()}): the PostgreSQL half of this test cannot run. ***")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
