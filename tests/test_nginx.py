"""The nginx files of docs/deploy in a real nginx (Debian's package) in front of a real
`tally serve`: the real client address, nginx's 429 beside Tally's quota_exceeded, slow
clients kept away from gunicorn, and the TLS site file accepted by `nginx -t`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from tests.conftest import (
    BIN,
    REPO,
    SERVER_ENV,
    WAIT,
    _without_database,
    bearer,
    database_env,
    free_port,
    http,
    provision,
    rows,
    stop_process,
)
from tests.realparts import require
from tests.routes import operations
from tests.test_quota import seed_usage

pytestmark = pytest.mark.slow

DEPLOY = REPO / "docs" / "deploy" / "nginx"
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
UPSTREAM = "127.0.0.1:8000"


def nginx_binary() -> str:
    return require("nginx", "/usr/sbin/nginx")


def http_context(tmp: Path) -> str:
    """What nginx.conf's http {} holds on Debian besides the includes: temp paths in tmp."""
    temp = "\n".join(f"    {name}_temp_path {tmp / name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""
    access_log off;
    error_log {tmp / 'error.log'} warn;
    default_type application/octet-stream;
{temp}
"""


def main_conf(tmp: Path, http_body: str) -> str:
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"{user}worker_processes 1;\npid {tmp / 'nginx.pid'};\nerror_log {tmp / 'error.log'} warn;\n"
            f"events {{ worker_connections 256; }}\nhttp {{\n{http_context(tmp)}\n{http_body}\n}}\n")


class Proxy:
    """nginx with tally-http.conf and tally-proxy.conf as shipped (only the upstream's
    port differs), one server block trusting 127.0.0.1 as a customer proxy."""

    def __init__(self, tmp: Path, upstream_port: int):
        self.tmp = tmp
        conf = tmp / "conf"
        (conf / "snippets").mkdir(parents=True)
        http_conf = (DEPLOY / "tally-http.conf").read_text()
        assert UPSTREAM in http_conf
        (conf / "tally-http.conf").write_text(http_conf.replace(UPSTREAM, f"127.0.0.1:{upstream_port}"))
        shutil.copyfile(DEPLOY / "tally-proxy.conf", conf / "snippets" / "tally-proxy.conf")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        server = f"""
    include {conf / 'tally-http.conf'};
    server {{
        listen 127.0.0.1:{self.port};
        set_real_ip_from 127.0.0.1;
        include {conf / 'snippets' / 'tally-proxy.conf'};
    }}
"""
        (conf / "nginx.conf").write_text(main_conf(tmp, server))
        self.proc = subprocess.Popen([nginx_binary(), "-p", str(tmp), "-c", str(conf / "nginx.conf"),
                                      "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                     stderr=open(tmp / "nginx.stderr", "wb"))
        deadline = time.monotonic() + WAIT
        while True:
            assert self.proc.poll() is None, (tmp / "nginx.stderr").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    def stop(self):
        stop_process(self.proc, signal.SIGQUIT)


class Stack:
    """nginx in front of `tally serve` on `db`, with a site and an account over quota."""

    def __init__(self, tmp: Path, db: str):
        account, site, key = provision(db, name="Proxied", plan="scale",
                                       scopes=("events", "read"))
        key = key["key"]
        full, full_site, full_key = provision(db, name="Over quota", host="q.example")
        full_key = full_key["key"]
        seed_usage(db, full["id"], 11_000, month=time.strftime("%Y-%m", time.gmtime()))

        port = free_port()
        self.log = open(tmp / "serve.log", "wb")
        # One sync worker: a slow client reaching it would hold the whole service.
        self.serve = subprocess.Popen(
            [str(BIN / "tally"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
            cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT,
            env={**_without_database(os.environ), **SERVER_ENV, **database_env(db),
                 "TALLY_FLUSH_INTERVAL": "0.2"})
        deadline = time.monotonic() + WAIT
        while True:
            assert self.serve.poll() is None, (tmp / "serve.log").read_text()
            try:
                if http("GET", f"http://127.0.0.1:{port}/healthz")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        self.proxy = Proxy(tmp, port)
        self.world = {"proxy": self.proxy, "db": db, "site": site["id"], "key": key,
                      "full_site": full_site["id"], "full_key": full_key}

    def stop(self):
        self.proxy.stop()
        self.serve.send_signal(signal.SIGTERM)
        self.serve.wait(WAIT)
        self.log.close()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory, module_database):
    """One stack per backend for the module, started when a test first asks."""
    started = {}

    def stack_on(backend: str) -> dict:
        if backend not in started:
            nginx_binary()
            started[backend] = Stack(tmp_path_factory.mktemp("nginx"), module_database(backend))
        return started[backend].world

    yield stack_on
    for stack in started.values():
        stack.stop()


@pytest.fixture
def stack(stacks, backend):
    return stacks(backend)


def has_collect() -> bool:
    return ("POST", "/api/v1/collect") in set(operations())


def test_the_real_client_address_reaches_tally(stack):
    if not has_collect():
        pytest.skip("POST /api/v1/collect is not in this build yet")
    proxy = stack["proxy"]
    body = orjson.dumps({"s": stack["site"], "e": "pageview", "u": "https://shop.example/from-gb"})
    # 127.0.0.1 is a trusted proxy in this server block: the address it forwards is the
    # visitor's (81.2.69.160 is in Great Britain).
    status, _, answer = http("POST", proxy.url + "/t/collect", body,
                             {"Content-Type": "text/plain", "User-Agent": UA,
                              "X-Forwarded-For": "81.2.69.160"})
    assert status == 204, answer
    # From an address that is no trusted proxy, a forged X-Forwarded-For is ignored.
    with socket.create_connection(("127.0.0.1", proxy.port), source_address=("127.0.0.2", 0)) as sock:
        forged = orjson.dumps({"s": stack["site"], "e": "pageview", "u": "https://shop.example/forged"})
        sock.sendall(b"POST /api/v1/collect HTTP/1.1\r\nHost: shop.example\r\nContent-Type: text/plain\r\n"
                     b"User-Agent: " + UA.encode() + b"\r\nX-Forwarded-For: 81.2.69.160\r\n"
                     b"Connection: close\r\nContent-Length: " + str(len(forged)).encode() + b"\r\n\r\n"
                     + forged)
        assert sock.recv(65536).startswith(b"HTTP/1.1 204")
    deadline = time.monotonic() + WAIT
    while True:
        found = {r["pathname"]: r["country"] for r in rows(stack["db"], "SELECT pathname, country FROM events")}
        if {"/from-gb", "/forged"} <= found.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found["/from-gb"] == "GB"
    assert found["/forged"] is None


def test_a_burst_gets_nginx_429_and_the_quota_429_stays_tallys(stack):
    proxy = stack["proxy"]
    statuses = []
    answer = None
    for _ in range(500):  # at 10 requests a second with bursts of 20, a loop trips it
        status, headers, body = http("GET", proxy.url + "/t/tally.js")
        statuses.append(status)
        if status == 429:
            answer = (headers, body)
            break
    assert answer is not None, statuses
    assert statuses[0] == 200  # the customer-domain path serves the script itself
    headers, body = answer
    assert orjson.loads(body) == {"ok": False, "error": {
        "code": "too_many_requests", "message": "too many requests from this address; slow down"}}
    assert headers["Retry-After"] == "1"
    # The keyed events endpoint is not limited by nginx: Tally's own 429 passes unchanged.
    event = {"s": stack["full_site"], "e": "pageview", "u": "https://q.example/", "ua": UA}
    status, headers, body = http("POST", proxy.url + "/api/v1/events", orjson.dumps(event),
                                 {**bearer(stack["full_key"]), "Content-Type": "application/json"})
    assert status == 429
    assert orjson.loads(body)["error"]["code"] == "quota_exceeded"
    assert int(headers["Retry-After"]) > 1


def test_a_slow_client_is_held_by_nginx_not_by_gunicorn(stack):
    proxy = stack["proxy"]
    slow = socket.create_connection(("127.0.0.1", proxy.port))
    try:
        slow.sendall(b"POST /api/v1/events HTTP/1.1\r\nHost: shop.example\r\n"
                     b"Authorization: Bearer " + stack["key"].encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{\"s\": ")
        # gunicorn has one sync worker: had nginx passed the unfinished request on, that
        # worker would be stuck reading its body until nginx gives up on the client
        # (client_body_timeout, 10 s), and these would not be answered within 9 s.
        for _ in range(3):
            with urllib.request.urlopen(proxy.url + "/healthz", timeout=9) as resp:
                assert resp.status == 200
        event = {"s": stack["site"], "e": "pageview", "u": "https://shop.example/meanwhile", "ua": UA}
        status, _, body = http("POST", proxy.url + "/api/v1/events", orjson.dumps(event),
                               {**bearer(stack["key"]), "Content-Type": "application/json"})
        assert status == 204, body
    finally:
        slow.close()


def test_a_body_over_64_kib_is_refused_by_nginx(stack):
    status, _, _ = http("POST", stack["proxy"].url + "/api/v1/payments", b"x" * 70_000,
                        {"Content-Type": "application/json"})
    assert status == 413


def test_the_tls_site_file_passes_nginx_t(tmp_path):
    nginx = nginx_binary()
    openssl = require("openssl")
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=tally.example.net", "-keyout", str(certs / "privkey.pem"),
                    "-out", str(certs / "fullchain.pem")], check=True, capture_output=True, timeout=60)
    conf = tmp_path / "conf"
    (conf / "snippets").mkdir(parents=True)
    shutil.copyfile(DEPLOY / "tally-proxy.conf", conf / "snippets" / "tally-proxy.conf")
    site = (DEPLOY / "tally-site.conf").read_text()
    site = site.replace("/etc/letsencrypt/live/tally.example.net", str(certs))
    (conf / "tally-site.conf").write_text(site)
    (conf / "nginx.conf").write_text(main_conf(tmp_path, f"""
    include {DEPLOY / 'tally-http.conf'};
    include {conf / 'tally-site.conf'};
"""))
    proc = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf / "nginx.conf")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "test is successful" in proc.stderr
    # The customer's snippet is valid inside a server block of its own.
    customer = (DEPLOY / "customer-proxy.conf").read_text().replace("tally.example.net", "127.0.0.1")
    (conf / "customer-proxy.conf").write_text(customer)
    (conf / "customer.conf").write_text(main_conf(tmp_path, f"""
    server {{ listen 127.0.0.1:{free_port()}; include {conf / 'customer-proxy.conf'}; }}
"""))
    proc = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf / "customer.conf")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
