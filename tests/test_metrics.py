"""GET /metrics: off without TALLY_METRICS_TOKEN, bearer-protected with it, and counters
that add up over every gunicorn worker (prometheus-client multiprocess mode)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest
import webtest

from app import create_app
from config import Config, ConfigError
from tests.conftest import (
    BIN,
    SERVER_ENV,
    WAIT,
    WriteLock,
    _without_database,
    bearer,
    config_for,
    database_env,
    free_port,
    http,
    provision,
    wait_until,
)
from tests.test_quota import seed_usage

TOKEN = "metrics-token-0123456789"
UA = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
BOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


def sample(text: str, name: str, **labels) -> float:
    """The value of one sample of the exposition text (0 when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        found_name, _, found_labels = metric.partition("{")
        found = ",".join(sorted(found_labels.rstrip("}").split(","))) if found_labels else ""
        if found_name == name and found == wanted:
            return float(value)
    return 0.0


def test_metrics_are_off_without_a_token(db_path):
    app = create_app(config_for(db_path))
    resp = webtest.TestApp(app).get("/metrics", expect_errors=True)
    assert resp.status_int == 404
    assert resp.json["error"] == {"code": "not_found",
                                  "message": "metrics are off: set TALLY_METRICS_TOKEN"}


def test_metrics_require_the_token(db_path):
    client = webtest.TestApp(create_app(config_for(db_path, metrics_token=TOKEN)))
    for headers in ({}, bearer("wrong-token-0123456789"), {"Authorization": TOKEN}):
        resp = client.get("/metrics", headers=headers, expect_errors=True)
        assert resp.status_int == 401
        assert resp.json["error"]["code"] == "unauthorized"
        assert TOKEN not in resp.text
    client.get("/healthz")
    resp = client.get("/metrics", headers=bearer(TOKEN))
    assert resp.content_type == "text/plain"
    assert sample(resp.text, "tally_http_requests_total", route="/healthz", method="GET",
                  status="200") >= 1
    assert sample(resp.text, "tally_http_requests_total", route="/metrics", method="GET",
                  status="401") >= 3
    assert sample(resp.text, "tally_database_size_bytes") > 0


def test_a_short_or_spaced_token_is_refused():
    for token in ("short", "has a space in it 0123"):
        with pytest.raises(ConfigError, match="TALLY_METRICS_TOKEN"):
            Config.from_env({"TALLY_METRICS_TOKEN": token})


def test_unknown_log_format_is_refused():
    with pytest.raises(ConfigError, match="TALLY_LOG_FORMAT"):
        Config.from_env({"TALLY_LOG_FORMAT": "xml"})
    assert Config.from_env({"TALLY_LOG_FORMAT": "JSON"}).log_format == "json"


class Served:
    """`tally serve` with two workers, the metrics token, and a small queue."""

    def __init__(self, tmp_path: Path, db: str, env: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()
        self.log_path = tmp_path / "serve.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(BIN / "tally"), "serve", "--bind", f"127.0.0.1:{self.port}", "--workers", "2"],
            cwd=tmp_path, stdout=self._log, stderr=subprocess.STDOUT,
            env={**_without_database(os.environ), **SERVER_ENV, **database_env(db),
                 "TMPDIR": str(self.tmpdir), **env})
        deadline = time.monotonic() + WAIT
        while True:
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            try:
                if http("GET", self.url + "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(WAIT)
        self._log.close()
        return self.proc.returncode


@pytest.mark.slow
def test_counters_after_known_traffic_add_up_over_two_workers(db_path, tmp_path):
    db = db_path
    account, site, key = provision(db, name="Metrics", host="m.example",
                                   scopes=("events", "payments", "read"))
    key = key["key"]
    full, full_site, full_key = provision(db, name="Over quota", host="q.example")
    full_key = full_key["key"]
    seed_usage(db, full["id"], 11_000, month=time.strftime("%Y-%m", time.gmtime()))

    server = Served(tmp_path, db, {"TALLY_METRICS_TOKEN": TOKEN, "TALLY_QUEUE_MAX": "50",
                                   "TALLY_LOG_FORMAT": "json"})
    try:
        headers = {**bearer(key), "Content-Type": "application/json"}

        def event(ua=UA, host="m.example", site_id=site["id"]):
            return {"s": site_id, "e": "pageview", "u": f"https://{host}/", "ip": "81.2.69.160",
                    "ua": ua}

        def post(body, auth=headers):
            return http("POST", server.url + "/api/v1/events", orjson.dumps(body), auth)[0]

        assert [post(event()) for _ in range(10)] == [204] * 10
        assert post({"s": site["id"], "b": [event(), event(BOT), event(BOT)]}) == 204
        # While another connection holds the write lock nothing is stored, so 50-event
        # batches fill the workers' queues (50 events each: at most one batch a worker)
        # until one is refused whole with 503 rate_limited.
        lock = WriteLock(db)
        batches = 0
        lean = {"e": "pageview", "u": "https://m.example/"}  # 50 of them fit in 8 KiB
        while (status := post({"s": site["id"], "b": [lean] * 50})) == 204:
            batches += 1
        lock.release()
        assert status == 503 and batches <= 2
        accepted = 11 + 50 * batches

        def metrics() -> str:
            status, _, body = http("GET", server.url + "/metrics", None, bearer(TOKEN))
            assert status == 200, body
            return body.decode()

        # The queues are full until the flush, let go by the lock, has stored them: a batch
        # sent before then is refused 503 before its quota is looked at.
        assert wait_until(lambda: sample(metrics(), "tally_events_total",
                                         outcome="stored") >= accepted)
        full_headers = {**bearer(full_key), "Content-Type": "application/json"}
        assert post({"s": full_site["id"], "b": [event(host="q.example", site_id=full_site["id"])] * 2},
                    full_headers) == 429
        payment = {"payment_id": "pay_m", "amount": 5, "currency": "EUR", "kind": "charge",
                   "paid_at": "2026-09-21T14:00:00Z", "customer": {"id": "cus_m"}}
        for _ in range(2):
            assert http("POST", server.url + "/api/v1/payments", orjson.dumps(payment), headers)[0] == 200
        assert http("GET", server.url + "/api/v1/stats/aggregate", None, bearer(key))[0] == 200
        text = metrics()
        events = {outcome: sample(text, "tally_events_total", outcome=outcome)
                  for outcome in ("accepted", "bot", "rate_limited", "quota_exceeded", "stored")}
        assert events == {"accepted": accepted, "bot": 2, "rate_limited": 50,
                          "quota_exceeded": 2, "stored": accepted}, text
        requests = {status: sample(text, "tally_http_requests_total", route="/api/v1/events",
                                   method="POST", status=status) for status in ("204", "503", "429")}
        assert requests == {"204": 11 + batches, "503": 1, "429": 1}
        assert sample(text, "tally_payment_upserts_total") == 2
        assert sample(text, "tally_flush_batch_size_sum") == accepted
        assert sample(text, "tally_flush_duration_seconds_count") == sample(
            text, "tally_flush_batch_size_count") >= 1
        assert sample(text, "tally_report_duration_seconds_count",
                      route="/api/v1/stats/aggregate") == 1
        assert "tally_event_queue_depth" in text
        assert sample(text, "tally_database_size_bytes") > 0
        assert re.search(r"^tally_wal_size_bytes \d", text, re.M)
        folders = list(server.tmpdir.glob("tally-metrics-*"))
        assert len(folders) == 1 and list(folders[0].glob("counter_*.db"))
    finally:
        code = server.stop()
    assert code == 0, server.log()
    # The multiprocess folder goes with the server.
    assert list(server.tmpdir.glob("tally-metrics-*")) == []
    lines = [line for line in server.log().splitlines() if line.strip()]
    parsed = [orjson.loads(line) for line in lines]  # TALLY_LOG_FORMAT=json: every line
    assert {"time", "level", "logger", "message", "pid"} <= set(parsed[0])
    assert any(entry["logger"] == "gunicorn.error" for entry in parsed)


def test_requests_are_counted_only_while_metrics_are_on(db_path):
    import metrics

    metrics.enable()  # the process counts (another app may have turned it on): the route middleware decides
    labels = {"route": "/healthz", "method": "GET", "status": "200"}

    def counted() -> float:
        return metrics.LOCAL.get_sample_value("tally_http_requests_total", labels) or 0.0

    off = create_app(config_for(db_path))
    before = counted()
    assert webtest.TestApp(off).get("/healthz").status_int == 200
    assert counted() == before  # nobody could read it: not counted
    off.stop(timeout=5)
    on = create_app(config_for(db_path, metrics_token=TOKEN))
    assert webtest.TestApp(on).get("/healthz").status_int == 200
    assert counted() == before + 1
    on.stop(timeout=5)
