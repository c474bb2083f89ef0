"""What a gunicorn worker holds in memory: its request threads share MALLOC_ARENAS malloc
arenas instead of one each (serving/memory.py; counted by glibc's own malloc_stats in a
process whose threads allocate at the same time), and the dashboard's and the Stripe
webhook's modules load on their first request, not in a worker that only ingests
(api/deferred.py; the modules seen from inside a real worker)."""

from __future__ import annotations

import ctypes
import os
import sqlite3
import subprocess
import sys
import threading

import falcon
import falcon.testing
import orjson
import pytest

from api.deferred import DeferredResource
from serving.memory import MALLOC_ARENAS
from storage.db import Database
from tests.conftest import REPO, bearer, cli_json, http, rows, wait_until

THREADS = 8
# Each thread allocates blocks too big for pymalloc (malloc serves them from the thread's
# arena) and holds them until every thread has, so none can reuse another's arena.
SCRIPT = f"""
import ctypes, runpy, sys, threading
if sys.argv[1] == "worker":
    runpy.run_path("gunicorn.conf.py")["post_fork"](None, None)
barrier = threading.Barrier({THREADS})
def allocate():
    held = [bytes(2048 + i) for i in range(50)]
    barrier.wait()
threads = [threading.Thread(target=allocate) for _ in range({THREADS})]
for thread in threads: thread.start()
for thread in threads: thread.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_used(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=True)
    return sum(1 for line in result.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_stats"),
                    reason="glibc's mallopt only")
def test_a_worker_shares_a_few_malloc_arenas_between_its_threads():
    assert arenas_used("plain") > MALLOC_ARENAS
    assert 1 <= arenas_used("worker") <= MALLOC_ARENAS


# Loaded by the dashboard's pages or the Stripe webhook only (api/deferred.py).
PAGE_AND_WEBHOOK_MODULES = ("dashboard.web", "jinja2", "api.stripe_webhook", "validation.stripe",
                            "storage.stripe", "stripe")


def _worker_modules(server) -> set[str]:
    status, _, body = http("GET", server.url + "/test/modules")
    assert status == 200
    return set(body.decode().splitlines())


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_worker_that_only_ingests_never_loads_the_dashboard_or_the_stripe_webhook(
        db_path, server_factory):
    account = cli_json("account", "create", "--name", "A", db=db_path)
    site = cli_json("site", "create", "--account", account["id"], "--host", "a.test", db=db_path)
    key = cli_json("key", "create", "--site", site["id"], "--scope", "events", db=db_path)["key"]
    server = server_factory(db_path, workers=1, app="tests.modules_app:app")
    batch = {"s": site["id"], "b": [{"e": "pageview", "u": f"https://a.test/{n}",
                                     "ip": "203.0.113.9", "ua": "Mozilla/5.0"} for n in range(20)]}
    status, _, body = http("POST", server.url + "/api/v1/events", orjson.dumps(batch),
                           bearer(key) | {"Content-Type": "application/json"})
    assert status == 204, body
    assert wait_until(lambda: rows(db_path, "SELECT count(*) AS n FROM events")[0]["n"] == 20)
    loaded = _worker_modules(server)
    assert "ingest.flusher" in loaded  # the probe sees the worker's own imports
    assert loaded.isdisjoint(PAGE_AND_WEBHOOK_MODULES)

    status, _, body = http("GET", server.url + "/login")
    assert status == 200 and b"<form" in body
    status, _, body = http("POST", server.url + f"/api/v1/integrations/stripe/{site['id']}",
                           b"{}", {"Stripe-Signature": "t=1,v1=00"})
    assert status == 400
    assert orjson.loads(body)["error"]["message"] == (
        f"no Stripe webhook secret is set for site {site['id']}")
    loaded = _worker_modules(server)
    assert {"dashboard.web", "jinja2", "api.stripe_webhook", "validation.stripe"} <= loaded


def test_a_deferred_resource_is_built_once_by_its_first_requests_and_answers_as_itself():
    builds = []
    gate = threading.Barrier(8)

    class Pages:
        def on_get_page(self, req, resp, name):
            resp.media = {"page": name}

        def on_post_page(self, req, resp, name):
            resp.status = 201

    def build():
        builds.append(1)
        return Pages()

    deferred = DeferredResource(build, ("on_get_page", "on_post_page"))
    wsgi = falcon.App()
    wsgi.add_route("/pages/{name}", deferred, suffix="page")
    client = falcon.testing.TestClient(wsgi)
    assert not deferred.built
    assert client.simulate_put("/pages/a").status_code == 405  # only the named responders
    assert not deferred.built

    answers = []

    def first_request(n: int):
        gate.wait()
        answers.append(client.simulate_get(f"/pages/p{n}").json)

    threads = [threading.Thread(target=first_request, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answer["page"] for answer in answers) == [f"p{n}" for n in range(8)]
    assert client.simulate_post("/pages/x").status_code == 201
    assert builds == [1]
    assert isinstance(deferred.resource, Pages)


def test_sqlite_connections_given_back_are_lent_to_the_next_thread(tmp_path):
    """A worker's request threads give their connection back after each request
    (ReleaseConnection): they hold as many as serve a request at once, not one each."""
    db = Database(str(tmp_path / "lent.db"))
    held: dict[str, object] = {}

    def in_thread(name: str, release: bool = True) -> None:
        def use():
            conn = db.conn()
            conn.execute("SELECT count(*) FROM sites").fetchone()
            held[name] = conn
            if release:
                db.release()
        thread = threading.Thread(target=use)
        thread.start()
        thread.join()

    in_thread("first")
    in_thread("second")
    assert held["second"] is held["first"]  # one after the other: one connection
    in_thread("keeps", release=False)
    in_thread("meanwhile")
    assert held["keeps"] is held["first"] and held["meanwhile"] is not held["first"]

    conn = db.conn()  # given back only outside a transaction
    with db.transaction(conn):
        db.release()
        assert db.conn() is conn
    with db.read_budget(60):
        db.release()
        assert db.conn() is conn
    db.release()
    assert db.conn() is conn
    db.release()  # idle when the process forks

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fork never uses its parent's connections
        os.write(write, b"1" if db.conn() is not conn else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"

    db.close()
    with pytest.raises(sqlite3.ProgrammingError):
        held["meanwhile"].execute("SELECT 1")  # closed with the database, though idle
