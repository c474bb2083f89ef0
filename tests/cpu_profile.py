"""CPU seconds of each test, its children included (gunicorn, the `tally` command, Chromium
once reaped), appended as "seconds nodeid" lines to the file TEST_CPU_LOG names:
`TEST_CPU_LOG=/tmp/cpu.log make test PYTEST_ADDOPTS='-p tests.cpu_profile'`, then
`python scripts/cpu_report.py /tmp/cpu.log`. The suite's CPU divided by the cores is the
floor of its wall time on a quiet machine, whatever else the machine was doing meanwhile.
The PostgreSQL server's own CPU is not in it (its processes are not the tests' children).
What each test process spent outside its tests (starting, collecting, session-wide fixtures
such as the shared Chromium, counted once it quits) is one more line, "(outside tests)"; an
xdist controller's own is not counted.
"""

from __future__ import annotations

import os
import resource

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_in_tests = 0.0


def _record(seconds: float, name: str) -> None:
    path = os.environ.get("TEST_CPU_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{seconds:.3f} {name}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _in_tests
    start = _cpu()
    yield
    seconds = _cpu() - start
    _in_tests += seconds
    _record(seconds, item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # An xdist controller's children are its test processes, already counted.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        _record(_cpu() - _in_tests, "(outside tests)")
