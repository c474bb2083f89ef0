"""The multiprocess folder of one gunicorn server: made fresh in the master before the
workers fork, told when a worker dies, removed when the master exits."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

# prometheus-client picks where values live when it is first imported, from this variable.
ENV_NAME = "PROMETHEUS_MULTIPROC_DIR"
directory: str | None = None


def prepare() -> str:
    """A new empty folder for this server's values; call before prometheus_client is imported."""
    global directory
    if "prometheus_client" in sys.modules and directory is None:
        raise RuntimeError("prometheus_client was imported before the metrics folder was set")
    directory = tempfile.mkdtemp(prefix="tally-metrics-")
    os.environ[ENV_NAME] = directory
    return directory


def worker_gone(pid: int) -> None:
    if directory is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, directory)


def remove() -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
