"""The background duties: one list, each run when due, a failure logged and retried."""

from __future__ import annotations

import logging

from app import create_app
from tasks import Task, Tasks
from tests.conftest import FakeClock, config_for, counting_bytes
from vocabulary import DAY_MS


def test_each_task_runs_when_due_and_a_failure_does_not_stop_the_others(caplog):
    clock = FakeClock(1000.0)
    ran = []

    def broken():
        raise RuntimeError("disk full")

    tasks = Tasks([Task("often", 10.0, lambda: ran.append("often")),
                   Task("broken", 10.0, broken),
                   Task("rarely", 100.0, lambda: ran.append("rarely"))], clock=clock)
    with caplog.at_level(logging.WARNING, logger="tally"):
        assert tasks.run_due() == ["often", "broken", "rarely"]
    assert "background task 'broken' failed (RuntimeError: disk full)" in caplog.text
    clock.now += 5
    assert tasks.run_due() == []
    clock.now += 5
    assert tasks.run_due() == ["often", "broken"]
    clock.now += 90
    assert tasks.run_due() == ["often", "broken", "rarely"]
    assert ran == ["often", "rarely", "often", "often", "rarely"]


def test_a_task_with_a_first_delay_waits_for_it_then_runs_every_period():
    clock = FakeClock(1000.0)
    tasks = Tasks([Task("later", 100.0, lambda: None, first=600.0)], clock=clock)
    assert tasks.run_due() == []
    clock.now += 599
    assert tasks.run_due() == []
    clock.now += 1
    assert tasks.run_due() == ["later"]
    clock.now += 99
    assert tasks.run_due() == []
    clock.now += 1
    assert tasks.run_due() == ["later"]


def test_the_app_prunes_visitor_salts_as_a_background_task(db_path):
    clock = FakeClock()
    tally = create_app(config_for(db_path), clock=clock,
                       random_bytes=counting_bytes())
    assert [task.name for task in tally.tasks.tasks] == [
        "prune visitor salts older than yesterday",
        "make the coming months' event partitions (PostgreSQL)",
        "count recent final days of traffic ahead of the reports"]
    today = int(clock() * 1000) // DAY_MS
    conn = tally.db.conn()
    conn.executemany("INSERT INTO visitor_salts (day, salt, created_at) VALUES (?, ?, 0)",
                     [(day, bytes(32)) for day in (today - 3, today - 2, today - 1, today)])
    tally.tasks.clock = clock
    tally.db.release()  # the task runs here on the test's thread and borrows its own
    assert tally.tasks.run_due() == ["prune visitor salts older than yesterday",
                                     "make the coming months' event partitions (PostgreSQL)"]
    conn = tally.db.conn()
    days = [row[0] for row in conn.execute("SELECT day FROM visitor_salts ORDER BY day")]
    assert days == [today - 1, today]
    tally.db.close()
