"""README's proxy recipes run in a real nginx: the script and its events served from the
customer's own domain (/t/tally.js, /t/collect), X-Forwarded-For believed only as far as
TALLY_TRUSTED_PROXIES allows, and the per-address rate limit in front of collect.

The nginx blocks are taken from README.md itself, with the upstream pointed at an
in-process Tally whose only trusted proxy is 127.0.0.1 (this nginx). The client connects
from 127.0.0.2, so its address is told apart from the proxy's.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import socket
import subprocess
import threading
import time

import orjson
import pytest

from app import create_app
from enrichment.visitor import visitor_id
from tests.conftest import REPO, WAIT, FakeClock, config_for, free_port, rows
from tests.realparts import DESKTOP_UA, require
from tests.test_browser import QuietHandler, ThreadingServer
from tracker import script_bytes
from validation.event import pack_ip

README = (REPO / "README.md").read_text()
CLIENT = "127.0.0.2"
BROWSER_ID = "0123456789abcdef0123456789abcdef"


def readme_block(after: str, language: str = "nginx") -> str:
    """The first ```language block of README after the text `after`."""
    start = README.index(after)
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(README, start)
    return match.group(1)


def nginx_config(folder, port: int, upstream: str) -> str:
    proxy = readme_block("**Proxying through your own domain**")
    proxy = proxy.replace("https://tally.example.net", upstream)
    limit = readme_block("**Abuse.**").replace("rate=10r/s", "rate=1r/m")
    limit = limit.replace("burst=40", "burst=2").replace("http://127.0.0.1:8000", upstream)
    zone = next(line for line in limit.splitlines() if line.startswith("limit_req_zone"))
    location = limit[limit.index("location"):]
    temp = " ".join(f"{kind}_temp_path {folder}/{kind};"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;" if os.geteuid() == 0 else ""
    return (f"{user} pid {folder}/nginx.pid; error_log {folder}/error.log; events {{}}\n"
            f"http {{ access_log off; {temp}\n{zone}\n"
            f"server {{ listen 127.0.0.1:{port};\n{proxy}\n{location}\n}} }}\n")


class Proxied:
    def __init__(self, folder, db_path: str):
        self.db_path = db_path
        self.clock = FakeClock()
        config = config_for(db_path, trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),))
        self.app = create_app(config, clock=self.clock)
        from wsgiref.simple_server import make_server

        self.server = make_server("127.0.0.1", 0, self.app, server_class=ThreadingServer,
                                  handler_class=QuietHandler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        account = self.app.directory.create_account("Shop", "scale")
        site = self.app.directory.create_site(account["id"], ["shop.example"])
        self.site = site["id"]
        self.site_number = rows(self.db_path, "SELECT id FROM sites WHERE public_id = ?",
                                (self.site,))[0]["id"]
        self.port = free_port()
        conf = folder / "nginx.conf"
        conf.write_text(nginx_config(folder, self.port,
                                     f"http://127.0.0.1:{self.server.server_port}"))
        self.nginx = subprocess.Popen([require("nginx", "/usr/sbin/nginx"), "-p", str(folder),
                                       "-c", str(conf), "-g", "daemon off;"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.error_log = folder / "error.log"
        deadline = time.monotonic() + WAIT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert self.nginx.poll() is None, self.nginx.stdout.read().decode()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None):
        """One request to nginx from the client's own address, 127.0.0.2."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT,
                                          source_address=(CLIENT, 0))
        try:
            conn.request(method, path, body=body, headers={"Host": "shop.example",
                                                          **(headers or {})})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def collect(self, path: str = "/t/collect", **headers):
        event = {"s": self.site, "e": "pageview", "u": "https://shop.example/", "v": BROWSER_ID}
        return self.request("POST", path, orjson.dumps(event),
                            {"Content-Type": "text/plain", "User-Agent": DESKTOP_UA, **headers})

    def stored(self) -> list[dict]:
        assert self.app.flusher.flush_now(timeout=WAIT)
        return rows(self.db_path, "SELECT * FROM events ORDER BY id")

    def daily_id(self, ip: str) -> int:
        day = int(self.clock() * 1000) // 86_400_000
        salt = rows(self.db_path, "SELECT salt FROM visitor_salts WHERE day = ?", (day,))[0]
        return visitor_id(salt["salt"], self.site_number, pack_ip(ip), DESKTOP_UA, day)

    def close(self):
        self.nginx.terminate()
        self.nginx.wait(WAIT)
        self.server.shutdown()
        self.server.server_close()
        self.app.stop(timeout=5)


@pytest.fixture
def proxied(tmp_path, db_path):
    world = Proxied(tmp_path, db_path)
    yield world
    world.close()


def test_the_script_is_served_from_the_customers_domain(proxied):
    status, body = proxied.request("GET", "/t/tally.js")
    assert status == 200 and body == script_bytes()


def test_events_through_the_proxy_carry_the_clients_address_not_a_forged_one(proxied):
    status, body = proxied.collect(**{"X-Forwarded-For": "6.6.6.6"})
    assert status == 204, body
    [event] = proxied.stored()
    link = rows(proxied.db_path, "SELECT daily_visitor_id FROM browser_links")
    # nginx appended 127.0.0.2; Tally trusts only 127.0.0.1, so 6.6.6.6 is never believed.
    assert link == [{"daily_visitor_id": proxied.daily_id(CLIENT)}]
    assert event["visitor_id"] not in (proxied.daily_id("6.6.6.6"), proxied.daily_id(CLIENT))


def test_the_rate_limit_recipe_refuses_a_burst_from_one_address(proxied):
    """The limit sits in the nginx in front of Tally, on /api/v1/collect (rate cut to one
    a minute here, so a burst of six is refused whatever the machine's speed)."""
    statuses = [proxied.collect("/api/v1/collect")[0] for _ in range(6)]
    assert 429 in statuses
    assert statuses[0] == 204 and statuses.count(204) <= 3  # burst 2 plus the first
