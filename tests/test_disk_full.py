"""A full disk that gets some space back: a batch too big for that space is stored in
parts, never given up at shutdown (on a 6 MB filesystem a flush of 7,385 events was lost
this way).

A real gunicorn with one worker: its flush thread is stuck on a full disk while thousands
of events are acknowledged and wait in its queue, to be taken as one batch. Then only
part of the space comes back, enough for a part of the batch in one transaction but not
for all of it, and the server gets SIGTERM: every acknowledged event must be stored once
it exits, none set aside.
"""

from __future__ import annotations

import signal
import time

import orjson
import pytest

from tests.conftest import Server, beside_tally, cli_json, execute, http, is_postgres, rows
from tests.fsfaults import tiny_filesystem
from tests.routes import event
from tests.test_faults import assert_database_consistent, seed, stored_event_numbers, wait_until

pytestmark = pytest.mark.slow

BATCH = 50  # events per request, the most one request may carry
EVENTS = 7_400
CHUNK = 128 * 1024


def send_batch(server: Server, world: dict, first: int) -> int:
    body = {"s": world["site"], "b": [
        {k: v for k, v in event(world["site"], f"/e/{n}").items() if k != "s"}
        for n in range(first, first + BATCH)]}
    return http("POST", server.url + "/api/v1/events", orjson.dumps(body), world["headers"])[0]


def queue_while_stuck(server: Server, world: dict, stuck_line: str) -> set[int]:
    """One event the flush cannot store, then the rest of EVENTS acknowledged behind it."""
    assert send_batch(server, world, 0) == 204
    assert wait_until(lambda: stuck_line in server.log()), server.log()[-3000:]
    acked = set(range(BATCH))
    for first in range(BATCH, EVENTS, BATCH):
        assert send_batch(server, world, first) == 204, server.log()[-3000:]
        acked |= set(range(first, first + BATCH))
    return acked


def fill_in_chunks(folder) -> list:
    """Fill the filesystem with files of CHUNK bytes (and one last smaller one)."""
    files, number = [], 0
    while True:
        path = folder / f"filler-{number:04d}"
        number += 1
        try:
            with open(path, "wb") as handle:
                handle.write(b"\0" * CHUNK)
            files.append(path)
        except OSError:
            path.unlink(missing_ok=True)
            break
    last = folder / "filler-last"
    try:
        with open(last, "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
    except OSError:
        pass
    return files


def drain_on_sigterm(server: Server) -> float:
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0, server.log()[-3000:]
    return time.monotonic() - started


def test_a_batch_too_big_for_the_space_freed_is_stored_in_parts(tmp_path):
    with tiny_filesystem(tmp_path / "disk", size_kib=6 * 1024) as disk:
        db = str(disk / "tally.db")
        world = seed(db)
        env = {"TALLY_QUEUE_MAX": "40000", "TALLY_FLUSH_INTERVAL": "0.2"}
        # Weeks of use leave free pages in the file: a visitor's events, erased.
        server = Server(db, workers=1, log_path=tmp_path / "before.log", env=env).wait_ready()
        try:
            for first in range(100_000, 100_000 + EVENTS, BATCH):
                assert send_batch(server, world, first) == 204
            assert wait_until(lambda: len(stored_event_numbers(db)) == EVENTS), server.log()[-3000:]
        finally:
            server.stop()
        for row in rows(db, "SELECT DISTINCT visitor_id FROM events"):
            cli_json("visitor", "erase", "--site", world["site"], "--visitor",
                     str(row["visitor_id"]), db=db)
        assert stored_event_numbers(db) == set()

        server = Server(db, workers=1, log_path=tmp_path / "server.log", env=env).wait_ready()
        try:
            files = fill_in_chunks(disk)
            acked = queue_while_stuck(server, world, "database or disk is full")
            # Half a megabyte back: all 7,400 events in one transaction need a write-ahead
            # log of about 1.1 MB; a part needs less, and once it is copied into the file's
            # free pages the log's space is written again.
            for path in files[:4]:
                path.unlink()
            seconds = drain_on_sigterm(server)
        finally:
            server.stop()
        log = server.log()
        assert "could not be stored" not in log
        assert "in smaller transactions" in log, log[-3000:]
        assert stored_event_numbers(db) == acked
        assert rows(db, "SELECT count(*) AS n FROM dead_letters") == [{"n": 0}]
        for path in disk.glob("filler-*"):
            path.unlink()
        assert_database_consistent(db)
        print(f"disk full: {len(acked)} events acknowledged, all stored; "
              f"drained {seconds:.1f} s after SIGTERM")


def test_on_postgresql_a_batch_too_big_for_the_space_left_is_stored_in_parts(postgres_schema,
                                                                            tmp_path):
    """PostgreSQL's disk cannot be filled for one schema: triggers raise disk_full as the
    server does when it cannot extend a file, first for every write, then only for a
    statement of more than 1,000 events (the space left holds that many)."""
    db = postgres_schema
    assert is_postgres(db)
    world = seed(db)
    server = Server(db, workers=1, log_path=tmp_path / "server.log",
                    env={"TALLY_QUEUE_MAX": "40000", "TALLY_FLUSH_INTERVAL": "0.2"}).wait_ready()
    try:
        execute(db, "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'"
                    " USING ERRCODE = 'disk_full'; END $$")
        execute(db, "CREATE TRIGGER disk_full BEFORE INSERT ON events FOR EACH ROW"
                    " EXECUTE FUNCTION disk_full()")
        acked = queue_while_stuck(server, world, "No space left on device")
        execute(db, "CREATE FUNCTION space_for_1000() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN IF (SELECT count(*) FROM added) > 1000 THEN"
                    " RAISE EXCEPTION 'could not extend file: No space left on device'"
                    " USING ERRCODE = 'disk_full'; END IF; RETURN NULL; END $$")
        beside_tally(db, "CREATE TRIGGER space_for_1000 AFTER INSERT ON events"
                         " REFERENCING NEW TABLE AS added FOR EACH STATEMENT"
                         " EXECUTE FUNCTION space_for_1000()")
        beside_tally(db, "DROP TRIGGER disk_full ON events")
        seconds = drain_on_sigterm(server)
    finally:
        server.stop()
    log = server.log()
    assert "could not be stored" not in log
    assert "in smaller transactions" in log, log[-3000:]
    assert stored_event_numbers(db) == acked
    assert rows(db, "SELECT count(*) AS n FROM dead_letters") == [{"n": 0}]
    assert_database_consistent(db)
    print(f"disk full (PostgreSQL): {len(acked)} events acknowledged, all stored; "
          f"drained {seconds:.1f} s after SIGTERM")
