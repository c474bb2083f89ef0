"""The multiprocess folder of one gunicorn server: made fresh in the master before the
workers fork, told when a worker dies, removed when the master exits."""

from __future__ import annotations

import contextlib
import glob
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
    """prometheus_client.multiprocess.mark_process_dead(pid): the dead worker's live gauges
    go. Done here without importing prometheus-client, which the master does not load: this
    runs in gunicorn's SIGCHLD handler, and an import there that a second SIGCHLD
    interrupts fails half-made (gunicorn's master then exits 1 on SIGTERM)."""
    if directory is not None:
        for path in glob.glob(os.path.join(directory, f"gauge_live*_{pid}.db")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def remove() -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
