"""The client: a bounded in-memory queue per process, drained by one sender thread.

Events are queued and return at once; the sender batches them (at most 50 events and
8 KiB a request, the server's limits) and backs off on 503, 500 and network errors,
starting from `Retry-After`, keeping the batch. A 429 `quota_exceeded` stops sending
until the time the server names: the server would refuse anything sooner. Payments are
sent at once and retried with the same `payment_id`, which the server treats as an
idempotency key.
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal

log = logging.getLogger("tally_client")

# The server's limits (POST /api/v1/events), and its messages for breaking them.
MAX_BODY_BYTES = 8_192
MAX_BATCH = 50
URL_MAX_BYTES = 2_048
PROPS_MAX_BYTES = 2_048
UID_MAX_BYTES = 128
TOO_LARGE = f"request body is larger than {MAX_BODY_BYTES} bytes"
INVALID_EVENT = "invalid event input: {field}: {message}"
FIELD_MESSAGES = {
    "u": f"required, an absolute http or https URL of at most {URL_MAX_BYTES} bytes",
    "p": f"must be a JSON object of at most {PROPS_MAX_BYTES} bytes",
    "uid": f"must be a string of 1-{UID_MAX_BYTES} bytes",
}

# 500 and 503 are the server's own transient answers; 502 and 504 come from a proxy in
# front of it, and a 429 that is not `quota_exceeded` is a proxy's rate limit.
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
FIRST_WAIT = 1.0
QUOTA_WAIT_UNKNOWN = 3_600.0
PAYMENT_ATTEMPTS = 6
ATEXIT_TIMEOUT = 5.0


class TallyError(Exception):
    """What Tally (or the network) answered: `status` (None for a network error or a check
    made before sending), `code` (Tally's error code) and `message`."""

    def __init__(self, status: int | None, code: str, message: str):
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class _Answer:
    __slots__ = ("status", "retry_after", "body")

    def __init__(self, status: int, retry_after: float | None, body: dict):
        self.status = status
        self.retry_after = retry_after
        self.body = body

    def error(self) -> TallyError:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(error, dict):
            return TallyError(self.status, str(error.get("code")), str(error.get("message")))
        return TallyError(self.status, "http_error", f"HTTP {self.status}")


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


class Tally:
    """Send events and payments to one Tally site.

    `on_error(error, batch)` is called with a `TallyError` and the list of event dicts that
    were given up (refused by the server, dropped during a quota block, too large, or not
    sent before `close()` ran out of time). It runs on the sender thread: keep it short.
    `clock`, `sleep_random` are injectable for tests (seconds since the epoch; a float in
    [0, 1) for jitter).
    """

    def __init__(self, base_url: str, key: str, site: str, *, flush_interval: float = 0.5,
                 max_queue: int = 10_000, timeout: float = 10, on_error: Callable | None = None,
                 sync: bool = False, backoff_cap: float = 30.0,
                 clock: Callable[[], float] = time.time,
                 jitter: Callable[[], float] = random.random):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"base_url must be an http or https URL, not {base_url!r}")
        self._scheme = parsed.scheme
        self._netloc = parsed.netloc
        self._prefix = parsed.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
                         "User-Agent": "tally-client-python/0.1.0"}
        self.site = site
        self.flush_interval = flush_interval
        self.max_queue = max_queue
        self.timeout = timeout
        self.on_error = on_error
        self.sync = sync
        self.backoff_cap = backoff_cap
        self._clock = clock
        self._jitter = jitter
        self._body_prefix = b'{"s":' + json.dumps(site).encode() + b',"b":['
        self.stats = {"queued": 0, "sent": 0, "retries": 0, "dropped_queue_full": 0,
                      "dropped_quota": 0, "failed": 0}
        self._quota_until = 0.0
        self._reset_process_state()
        _CLIENTS.add(self)
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: (c := ref()) and c._reset_process_state())

    # -- the public API -------------------------------------------------------------------

    def event(self, name: str, url: str, *, ip: str | None = None, ua: str | None = None,
              referrer: str | None = None, title: str | None = None, props: dict | None = None,
              ts: int | float | datetime | None = None, width: int | None = None,
              language: str | None = None, uid: str | None = None) -> bool:
        """Queue one event; True when queued (or, with sync=True, sent). Never blocks."""
        fields = {"e": name, "u": url, "r": referrer, "t": title, "w": width, "l": language,
                  "uid": uid, "p": props, "ip": ip, "ua": ua, "ts": self._ts(ts)}
        event = {k: v for k, v in fields.items() if v is not None}
        encoded = self._check(event)
        if encoded is None:
            return False
        if self._quota_blocked():
            self._drop_for_quota([event])
            return False
        if self.sync:
            return self._send([(event, encoded)], deadline=time.monotonic() + self.timeout)
        with self._cond:
            if len(self._queue) >= self.max_queue:
                self.stats["dropped_queue_full"] += 1
                return False
            self._queue.append((event, encoded))
            self.stats["queued"] += 1
            if len(self._queue) >= MAX_BATCH:
                self._cond.notify_all()
        self._ensure_sender()
        return True

    def pageview(self, url: str, **fields) -> bool:
        return self.event("pageview", url, **fields)

    def identify(self, user_id: str, *, ip: str | None = None, ua: str | None = None,
                 url: str) -> bool:
        """Link the visitor behind ip+ua to your user id (an `$identify` event)."""
        return self.event("$identify", url, ip=ip, ua=ua, uid=user_id)

    def payment(self, data: Mapping | None = None, /, **fields) -> str:
        """Store one payment; returns its payment_id or raises TallyError.

        Retried on 503, 500 and network errors with the same payment_id, which updates
        rather than duplicates on the server."""
        payment = {**(data or {}), **fields}
        body = json.dumps(payment, separators=(",", ":"), default=_json_default).encode()
        wait = None
        for attempt in range(1, PAYMENT_ATTEMPTS + 1):
            try:
                answer = self._post("/api/v1/payments", body)
            except TallyError as error:
                last, retry_after = error, None
            else:
                if 200 <= answer.status < 300:
                    return answer.body["data"]["payment_id"]
                last, retry_after = answer.error(), answer.retry_after
                if not self._transient(answer):
                    raise last
            if attempt == PAYMENT_ATTEMPTS:
                break
            self.stats["retries"] += 1
            wait = self._backoff(wait, retry_after)
            time.sleep(wait)
        raise last

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued event is sent or given up; False if `timeout` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._queue:
            self._ensure_sender()
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while self._queue or self._in_flight:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining if remaining is not None else 0.5)
                return True
            finally:
                self._flushers -= 1

    def close(self, timeout: float | None = None) -> bool:
        """Flush, give up whatever is still unsent after `timeout` (through on_error), and
        stop the sender. Events queued after close() are sent by a new sender."""
        with self._cond:
            self._give_up_at = None if timeout is None else time.monotonic() + timeout
        done = self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            self._stopping = False
            self._give_up_at = None
            self._thread = None
        if left:
            self._give_up([event for event, _ in left],
                          TallyError(None, "not_sent", "the client was closed before sending"))
        return done and not left

    # -- queueing ------------------------------------------------------------------------

    def _reset_process_state(self) -> None:
        """A fresh queue, lock and sender for this process (also in a forked child, whose
        parent still owns and sends what it had queued)."""
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._in_flight = 0
        self._flushers = 0
        self._stopping = False
        self._give_up_at: float | None = None
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    def _ensure_sender(self) -> None:
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="tally-client-sender",
                                            daemon=True)
            self._thread.start()

    def _ts(self, ts) -> int:
        # Stamped when queued, so a batch sent late after back-off keeps its real time.
        if ts is None:
            return int(self._clock() * 1000)
        if isinstance(ts, datetime):
            return int(ts.timestamp() * 1000)
        return int(ts)

    def _check(self, event: dict) -> bytes | None:
        """The event as JSON, or None after reporting why the server would refuse it."""
        encoded = json.dumps(event, separators=(",", ":"), ensure_ascii=False,
                             default=_json_default).encode()
        problem = None
        if not isinstance(event["u"], str) or len(event["u"].encode()) > URL_MAX_BYTES:
            problem = INVALID_EVENT.format(field="u", message=FIELD_MESSAGES["u"])
        elif "p" in event and (not isinstance(event["p"], dict) or len(json.dumps(
                event["p"], separators=(",", ":"), ensure_ascii=False,
                default=_json_default).encode()) > PROPS_MAX_BYTES):
            problem = INVALID_EVENT.format(field="p", message=FIELD_MESSAGES["p"])
        elif "uid" in event and len(str(event["uid"]).encode()) > UID_MAX_BYTES:
            problem = INVALID_EVENT.format(field="uid", message=FIELD_MESSAGES["uid"])
        elif len(self._body_prefix) + len(encoded) + 2 > MAX_BODY_BYTES:
            problem = TOO_LARGE
        if problem is None:
            return encoded
        self._give_up([event], TallyError(None, "invalid_input", problem))
        return None

    def _take_batch(self) -> list:
        """Up to 50 events whose request body fits in 8 KiB, oldest first."""
        batch, size = [], len(self._body_prefix) + 2
        while self._queue and len(batch) < MAX_BATCH:
            encoded = self._queue[0][1]
            extra = len(encoded) + (1 if batch else 0)
            if size + extra > MAX_BODY_BYTES:
                break
            batch.append(self._queue.popleft())
            size += extra
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                filled_by = time.monotonic() + self.flush_interval
                while (len(self._queue) < MAX_BATCH and not self._flushers
                       and not self._stopping):
                    remaining = filled_by - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._take_batch()
                self._in_flight = len(batch)
            try:
                self._send(batch, deadline=None)
            except Exception:  # a bug here must not kill the sender and strand the queue
                log.exception("tally_client: sending a batch failed")
            finally:
                with self._cond:
                    self._in_flight = 0
                    self._cond.notify_all()

    # -- sending -------------------------------------------------------------------------

    def _send(self, batch: list, deadline: float | None) -> bool:
        """Send one batch until it is stored, refused, or given up; True when stored."""
        events = [event for event, _ in batch]
        body = self._body_prefix + b",".join(encoded for _, encoded in batch) + b"]}"
        wait = None
        while True:
            if self._quota_blocked():
                self._drop_for_quota(events)
                return False
            try:
                answer = self._post("/api/v1/events", body)
            except TallyError as error:
                failure, retry_after = error, None
            else:
                if 200 <= answer.status < 300:
                    with self._cond:
                        self.stats["sent"] += len(events)
                    return True
                failure, retry_after = answer.error(), answer.retry_after
                if answer.status == 429 and failure.code == "quota_exceeded":
                    self._quota_until = self._clock() + (retry_after or QUOTA_WAIT_UNKNOWN)
                    log.warning("tally_client: over the monthly quota; not sending for %.0f s",
                                retry_after or QUOTA_WAIT_UNKNOWN)
                    self._drop_for_quota(events, failure)
                    return False
                if not self._transient(answer):
                    self._give_up(events, failure)
                    return False
            wait = self._backoff(wait, retry_after)
            stop_at = self._give_up_at if deadline is None else deadline
            if stop_at is not None and time.monotonic() + wait > stop_at:
                self._give_up(events, failure)
                return False
            with self._cond:
                self.stats["retries"] += 1
            log.info("tally_client: %s; retrying %d events in %.2f s", failure, len(events), wait)
            self._pause(wait)

    def _pause(self, seconds: float) -> None:
        # Woken early when close() sets a deadline, so it is checked at once.
        with self._cond:
            if self._give_up_at is None:
                self._cond.wait_for(lambda: self._give_up_at is not None, timeout=seconds)
                return
        time.sleep(seconds)

    def _backoff(self, previous: float | None, retry_after: float | None) -> float:
        """Retry-After (or 1 s) first, then doubling with jitter, up to backoff_cap."""
        floor = retry_after if retry_after is not None else FIRST_WAIT
        if previous is None:
            return min(max(floor, 0.0), self.backoff_cap)
        doubled = min(previous * 2, self.backoff_cap)
        return min(max(floor, doubled * (0.5 + 0.5 * self._jitter())), self.backoff_cap)

    @staticmethod
    def _transient(answer: _Answer) -> bool:
        if answer.status in TRANSIENT_STATUSES:
            return True
        return answer.status == 429 and answer.error().code != "quota_exceeded"

    def _quota_blocked(self) -> bool:
        return self._clock() < self._quota_until

    def _drop_for_quota(self, events: list, error: TallyError | None = None) -> None:
        with self._cond:
            self.stats["dropped_quota"] += len(events)
        self._report(events, error or TallyError(
            429, "quota_exceeded", "the account is over its monthly event quota"))

    def _give_up(self, events: list, error: TallyError) -> None:
        with self._cond:
            self.stats["failed"] += len(events)
        log.error("tally_client: %d events not sent: %s", len(events), error)
        self._report(events, error)

    def _report(self, events: list, error: TallyError) -> None:
        if self.on_error is None:
            return
        try:
            self.on_error(error, events)
        except Exception:
            log.exception("tally_client: on_error raised")

    def _post(self, path: str, body: bytes) -> _Answer:
        """One POST on this thread's keep-alive connection; a network failure is a
        TallyError with status None. A connection the server closed while idle is
        reopened once at no cost."""
        for fresh in (False, True):
            conn, reused = self._connection(fresh)
            try:
                conn.request("POST", self._prefix + path, body=body, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if reused and not fresh:
                    continue
                raise TallyError(None, "network_error", f"{type(exc).__name__}: {exc}") from exc
            if response.will_close:
                conn.close()
                self._local.conn = None
            try:
                parsed = json.loads(data) if data else {}
            except ValueError:
                parsed = {}
            return _Answer(response.status, _retry_after(response.getheader("Retry-After")),
                           parsed)
        raise AssertionError("unreachable")

    def _connection(self, fresh: bool):
        conn = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn, True
        factory = (http.client.HTTPSConnection if self._scheme == "https"
                   else http.client.HTTPConnection)
        conn = factory(self._netloc, timeout=self.timeout)
        self._local.conn = conn
        return conn, False


def _json_default(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        # The server reads a number's shortest repr exactly, so 49.99 stays 49.99.
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_CLIENTS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for client in list(_CLIENTS):
        if client._pid == os.getpid() and (client._queue or client._in_flight):
            client.close(ATEXIT_TIMEOUT)
