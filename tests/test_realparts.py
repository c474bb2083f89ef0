"""The real parts the browser and proxy tests stand on are there and work."""

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests import conftest
from tests.conftest import http, provision
from tests.realparts import chromium_driver, require


def test_headless_chromium_renders_a_page_on_a_test_hostname():
    driver = chromium_driver()
    try:
        driver.get("data:text/html,<title>tally</title><p id=x>ok</p>")
        assert driver.title == "tally"
        assert driver.execute_script("return navigator.webdriver") is True
    finally:
        driver.quit()


def test_nginx_is_installed_and_parses_a_config(tmp_path):
    nginx = require("nginx", "/usr/sbin/nginx")
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"pid {tmp_path}/nginx.pid; error_log stderr; events {{}} "
                    "http { server { listen 127.0.0.1:1; } }\n")
    result = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


class _AnotherServer(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_a_test_server_whose_port_another_server_took_starts_on_another(
        db_path, monkeypatch):
    # Another test process's server bound the port between free_port() and gunicorn's bind,
    # and answers /healthz 200 there: the test's server must not be taken for ready on it.
    provision(db_path)
    taken = ThreadingHTTPServer(("127.0.0.1", 0), _AnotherServer)
    threading.Thread(target=taken.serve_forever, daemon=True).start()
    ports = iter([taken.server_address[1]])
    free_port = conftest.free_port
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or free_port())
    server = conftest.Server(db_path, workers=1)
    try:
        assert server.port == taken.server_address[1] and not server.holds_port()
        server.wait_ready()
        assert server.port != taken.server_address[1] and server.holds_port()
        status, _, body = http("GET", server.url + "/healthz")
        assert status == 200 and body != b"ok"  # Tally's answer, not the other server's
        assert "Connection in use" in server.log()
    finally:
        server.stop()
        taken.shutdown()
        taken.server_close()


def test_a_free_port_is_outside_the_kernels_ephemeral_range_and_in_this_processs_block():
    # Neither an outgoing connection nor another test process's server can take it first.
    low = conftest._ephemeral_low()
    if conftest._PORT_BASE + (conftest._XDIST_INDEX + 1) * conftest.PORT_BLOCK > low:
        pytest.skip(f"this machine's ephemeral ports start at {low}: free_port asks the kernel")
    first = conftest._PORT_BASE + conftest._XDIST_INDEX * conftest.PORT_BLOCK
    ports = [conftest.free_port() for _ in range(3)]
    assert len(set(ports)) == 3
    assert all(first <= port < first + conftest.PORT_BLOCK < low for port in ports)


def test_a_free_port_passes_over_one_that_is_held(monkeypatch):
    first = conftest._PORT_BASE + conftest._XDIST_INDEX * conftest.PORT_BLOCK
    if first + conftest.PORT_BLOCK > conftest._ephemeral_low():
        pytest.skip("this machine's ephemeral ports start low: free_port asks the kernel")
    monkeypatch.setattr(conftest, "_next_port", [0])
    held = conftest.free_port()
    monkeypatch.setattr(conftest, "_next_port", [0])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", held))
        holder.listen()
        assert conftest.free_port() == held + 1
