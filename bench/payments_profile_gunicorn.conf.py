"""gunicorn settings for bench/payments_profile.py: Tally's own gunicorn.conf.py, every hook
kept, plus timers around each worker's payment writer (bench.payments_profile.instrument)."""

import runpy
from pathlib import Path

globals().update(runpy.run_path(str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py")))
_tally_post_worker_init = post_worker_init  # noqa: F821 - from Tally's file
_tally_worker_exit = worker_exit  # noqa: F821 - from Tally's file


def post_worker_init(worker):
    _tally_post_worker_init(worker)
    from bench.payments_profile import instrument

    instrument()


def worker_exit(server, worker):
    from bench.payments_profile import dump

    dump()
    _tally_worker_exit(server, worker)
