"""CPU seconds of each test, its children included (gunicorn, the `tally` command, Chromium
once reaped), appended as "seconds nodeid" lines to the file TEST_CPU_LOG names:
`TEST_CPU_LOG=/tmp/cpu.log make test PYTEST_ADDOPTS='-p tests.cpu_profile'`, then
`python scripts/cpu_report.py /tmp/cpu.log`. The suite's CPU divided by the cores is the
floor of its wall time on a quiet machine, whatever else the machine was doing meanwhile.
The PostgreSQL server's own CPU is not in it (its processes are not the tests' children).
"""

from __future__ import annotations

import os
import resource

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu()
    yield
    path = os.environ.get("TEST_CPU_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{_cpu() - start:.3f} {item.nodeid}\n")
