"""The Python client library (clients/python, `tally_client`) against a real gunicorn running
Tally: zero loss under back-pressure, no retry storm over quota, retries through 500s and
503s, payments stored once, a clean close() under load, and a forked child's own sender."""

from __future__ import annotations

import os
import threading
import time

import pytest
from tally_client import Tally, TallyError

from quota.usage import month_of
from tests.conftest import (
    WAIT,
    WriteLock,
    execute,
    provision,
    rows,
    servers_per_backend,
    wait_until,
)

pytestmark = pytest.mark.slow

UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
URL = "https://shop.example/pricing"


def make_site(db: str, plan: str = "growth") -> dict:
    account, site, key = provision(db, plan=plan, scopes=("events", "payments", "read"))
    return {"account": account["id"], "site": site["id"], "key": key["key"]}


def stored(db: str, name: str | None = None) -> int:
    if name is None:
        return rows(db, "SELECT count(*) AS n FROM events")[0]["n"]
    return rows(db, "SELECT count(*) AS n FROM events WHERE name = ?", (name,))[0]["n"]


def wait_stored(db: str, expected: int, name: str | None = None, timeout: float = WAIT) -> int:
    """Events reach the database on the server's flush; wait for them (bounded)."""
    deadline = time.monotonic() + timeout
    while (count := stored(db, name)) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def request_log(path) -> list[str]:
    """What the server received on the API (the readiness probes of /healthz left out)."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if "/api/" in line]


class Errors:
    def __init__(self):
        self.calls: list[tuple[TallyError, list]] = []
        self.lock = threading.Lock()

    def __call__(self, error, batch):
        with self.lock:
            self.calls.append((error, batch))


@pytest.fixture(scope="module")
def plain_servers(module_database):
    """One plain 2-worker server per backend for the module, for the tests that count only
    events of names of their own."""
    yield from servers_per_backend(module_database, workers=2)


@pytest.fixture
def plain(plain_servers, backend):
    """(server, db): the module's plain server on the test's backend."""
    return plain_servers(backend)


# Enough to fill the server's queues of 500 many times over; after the first 503 each
# round trip waits the server's Retry-After, so more events only make the test longer.
PER_THREAD = 750


def test_zero_loss_through_503s_from_a_tiny_queue(db_path, server_factory):
    db = db_path
    ids = make_site(db)
    server = server_factory(db, workers=2, env={"TALLY_QUEUE_MAX": "500",
                                                "TALLY_FLUSH_INTERVAL": "0.5"})
    errors = Errors()
    client = Tally(server.url, ids["key"], ids["site"], flush_interval=0.02, max_queue=20_000,
                   on_error=errors)
    # The write lock held by another connection keeps the flush from storing, so the
    # server's queues of 500 fill and answer 503 however fast the server is; it is let
    # go once the client has had to back off.
    lock = WriteLock(db)

    def send(thread: int) -> None:
        for n in range(PER_THREAD):
            assert client.event(f"load-{thread}", URL, ip="203.0.113.7", ua=UA, props={"n": n})

    threads = [threading.Thread(target=send, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + WAIT
    while client.stats["retries"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    lock.release()
    for thread in threads:
        thread.join()
    assert client.stats["retries"] > 0, "no 503 while the write lock was held"
    assert client.flush(timeout=WAIT)
    assert errors.calls == []
    assert client.stats["sent"] == 8 * PER_THREAD
    assert wait_stored(db, 8 * PER_THREAD) == 8 * PER_THREAD
    for thread in range(8):
        assert stored(db, f"load-{thread}") == PER_THREAD
    client.close()


def test_over_quota_the_client_stops_sending_instead_of_retrying(db_path, tmp_path, server_factory):
    db = db_path
    ids = make_site(db, plan="free")
    execute(db, "INSERT INTO monthly_usage (account_id, month, events) "
                "SELECT id, ?, 11000 FROM accounts WHERE public_id = ?",
            (month_of(time.time()), ids["account"]))
    log = tmp_path / "requests.log"
    server = server_factory(db, workers=1, app="tests.faulty_app:app",
                            env={"TEST_REQUEST_LOG": str(log)})
    errors = Errors()
    client = Tally(server.url, ids["key"], ids["site"], flush_interval=0.01, on_error=errors)
    for n in range(300):
        if n == 60:
            client.flush(timeout=WAIT)
        client.event("pageview", URL, ip="203.0.113.7", ua=UA)
        time.sleep(0.002)
    client.flush(timeout=WAIT)
    events_requests = [line for line in request_log(log) if "/api/v1/events" in line]
    assert events_requests == ["POST /api/v1/events 429"]
    assert client.stats["dropped_quota"] == 300
    assert client.stats["sent"] == 0
    assert {error.code for error, _ in errors.calls} == {"quota_exceeded"}
    assert sum(len(batch) for _, batch in errors.calls) == 300
    assert stored(db) == 0
    client.close()


def test_a_batch_gets_through_a_server_answering_500_twice(db_path, tmp_path, server_factory):
    db = db_path
    ids = make_site(db)
    log = tmp_path / "requests.log"
    server = server_factory(db, workers=1, app="tests.faulty_app:app", env={
        "TEST_FAULTS": "/api/v1/events=500x2", "TEST_REQUEST_LOG": str(log)})
    errors = Errors()
    client = Tally(server.url, ids["key"], ids["site"], backoff_cap=1.0, on_error=errors)
    for n in range(10):
        client.pageview(f"{URL}?n={n}", ip="203.0.113.7", ua=UA)
    assert client.flush(timeout=WAIT)
    assert [line.split()[-1] for line in request_log(log)] == ["500", "500", "204"]
    assert errors.calls == []
    assert client.stats == {**client.stats, "sent": 10, "retries": 2, "failed": 0}
    assert wait_stored(db, 10) == 10
    client.close()


def test_other_4xx_are_reported_once_and_never_retried(db_path, tmp_path, server_factory):
    db = db_path
    ids = make_site(db)
    log = tmp_path / "requests.log"
    server = server_factory(db, workers=1, app="tests.faulty_app:app",
                            env={"TEST_REQUEST_LOG": str(log)})
    errors = Errors()
    client = Tally(server.url, ids["key"], ids["site"], on_error=errors)
    client.pageview("https://elsewhere.example/", ip="203.0.113.7", ua=UA)
    assert client.flush(timeout=WAIT)
    assert request_log(log) == ["POST /api/v1/events 400"]
    [(error, batch)] = errors.calls
    assert (error.status, error.code) == (400, "invalid_input")
    assert "host" in error.message
    assert batch[0]["u"] == "https://elsewhere.example/"
    assert client.stats["failed"] == 1
    client.close()


def test_a_payment_is_retried_after_a_503_and_stored_once(db_path, tmp_path, server_factory):
    db = db_path
    ids = make_site(db)
    log = tmp_path / "requests.log"
    server = server_factory(db, workers=1, app="tests.faulty_app:app", env={
        "TEST_FAULTS": "/api/v1/payments=503x1", "TEST_REQUEST_LOG": str(log)})
    client = Tally(server.url, ids["key"], ids["site"])
    payment_id = client.payment({
        "payment_id": "ch_1", "customer": {"id": "cus_1", "email": "A@Example.com"},
        "amount": 49.99, "currency": "usd", "kind": "charge",
        "paid_at": "2026-11-01T10:00:00Z"})
    assert payment_id == "ch_1"
    assert request_log(log) == ["POST /api/v1/payments 503", "POST /api/v1/payments 200"]
    stored_payments = rows(db, "SELECT payment_id, amount, currency FROM payments")
    assert stored_payments == [{"payment_id": "ch_1", "amount": "49.99", "currency": "USD"}]

    with pytest.raises(TallyError) as refused:
        client.payment(payment_id="ch_2", customer={"id": "cus_1"}, amount=-1, currency="USD",
                       kind="charge", paid_at="2026-11-01T10:00:00Z")
    assert (refused.value.status, refused.value.code) == (400, "invalid_input")
    assert refused.value.message == "invalid payment input: amount: must be greater than 0"
    assert request_log(log)[-1] == "POST /api/v1/payments 400"
    assert len(request_log(log)) == 3
    client.close()


def test_close_under_load_leaves_nothing_queued(plain):
    server, db = plain
    ids = make_site(db)
    client = Tally(server.url, ids["key"], ids["site"], flush_interval=0.05)
    stop = threading.Event()
    queued = [0] * 4

    def send(thread: int) -> None:
        while not stop.is_set() and queued[thread] < 3_000:
            queued[thread] += client.event("close", URL, ip="203.0.113.7", ua=UA)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: sum(queued) >= 1_000)  # closed while the threads still send
    stop.set()
    for thread in threads:
        thread.join()
    assert client.close(timeout=WAIT)
    assert not client._queue
    assert client.stats["sent"] == sum(queued) > 0
    assert wait_stored(db, sum(queued)) == sum(queued)


def test_a_forked_child_sends_its_own_events(plain):
    server, db = plain
    ids = make_site(db)
    client = Tally(server.url, ids["key"], ids["site"], flush_interval=0.05)
    client.event("parent", URL, ip="203.0.113.7", ua=UA)
    assert client.flush(timeout=WAIT)
    pid = os.fork()
    if pid == 0:  # the child: a sender thread of its own, started on its first event
        ok = all(client.event("child", URL, ip="198.51.100.9", ua=UA) for _ in range(25))
        os._exit(0 if ok and client.close(timeout=WAIT) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.event("parent", URL, ip="203.0.113.7", ua=UA)
    assert client.close(timeout=WAIT)
    assert wait_stored(db, 25, "child") == 25
    assert wait_stored(db, 2, "parent") == 2


def test_sync_mode_sends_in_the_calling_thread(plain):
    server, db = plain
    ids = make_site(db)
    client = Tally(server.url, ids["key"], ids["site"], sync=True)
    assert client.event("sync", URL, ip="203.0.113.7", ua=UA)
    assert client.stats["sent"] == 1 and client._thread is None
    assert wait_stored(db, 1, "sync") == 1
