"""gunicorn settings for Tally, picked up from the repo root by `gunicorn app:app`.

Command-line flags (--bind, --workers) override these values.
"""

import gc
import logging
import sys

bind = "127.0.0.1:8000"
workers = 2
# Threads, so that idle or slow clients cannot hold every worker: a connection that has
# sent nothing, or waits between keep-alive requests, sits in the worker's poller; a
# read that waits more than serving.worker.READ_TIMEOUT seconds closes the connection.
worker_class = "serving.worker.TallyThreadWorker"
threads = 16
keepalive = 5
timeout = 30
# SIGTERM gives each worker this long to finish its request and flush its queue.
graceful_timeout = 30
# Bounds on what gunicorn reads before the application sees a request. The longest
# legitimate request line (a report query, or a 128-character id percent-encoded)
# is far below 2 KiB; the body limits (8 KiB / 64 KiB) are enforced by the app.
limit_request_line = 2048
limit_request_fields = 50
limit_request_field_size = 4096
# Plain lines, or one JSON object per line with TALLY_LOG_FORMAT=json.
logger_class = "serving.logs.TallyLogger"


def on_starting(server):
    """Refuse to start, in the master, when the configuration is bad or the database
    cannot be opened, is corrupt or is read-only: a clear line and exit 1, no workers."""
    from serving import metrics_folder

    metrics_folder.prepare()  # before anything imports prometheus_client
    from config import ConfigError
    from storage.db import StorageError

    try:
        from app import create_app_from_env

        tally = create_app_from_env()
        tally.db.check_startup()
        _announce_setup(server, tally)
    except (ConfigError, StorageError) as exc:
        server.log.error("tally: refusing to start: %s", exc)
        sys.exit(1)


def _announce_setup(server, tally):
    """On an installation with no user, one line (from the master: once, whatever the
    workers) with a new one-time setup link."""
    import time

    from dashboard.first_run import setup_line, setup_url
    from storage.people import People

    try:
        token = People(tally.db, time.time).new_setup_token()
    finally:
        tally.db.close()
    if token is not None:
        bind = server.cfg.bind[0] if server.cfg.bind else None
        server.log.warning(setup_line(setup_url(tally.config.public_url, bind, token)))


def post_fork(server, worker):
    from serving.memory import limit_arenas

    limit_arenas()  # before the worker starts its threads


def post_worker_init(worker):
    from api.wire_errors import install as answer_wire_errors_in_json

    answer_wire_errors_in_json()
    tally_log = logging.getLogger("tally")
    tally_log.handlers = list(worker.log.error_log.handlers)
    tally_log.setLevel(worker.wsgi.config.log_level)
    tally_log.propagate = False
    worker.wsgi.start()
    # The flush allocates many short-lived objects, and every full collection the
    # cyclic GC runs walks the whole heap: the app, Falcon and the parsers, which live
    # as long as the worker. Freezing them keeps those walks small (about 1.5 us of
    # flush CPU an event under batch load, docs/perf-notes.md); objects made later are
    # collected as before.
    gc.collect()
    gc.freeze()


def worker_exit(server, worker):
    wsgi = getattr(worker, "wsgi", None)
    if wsgi is not None and hasattr(wsgi, "stop"):
        wsgi.stop(timeout=graceful_timeout - 5)


def child_exit(server, worker):
    from serving import metrics_folder

    metrics_folder.worker_gone(worker.pid)


def on_exit(server):
    from serving import metrics_folder

    metrics_folder.remove()
