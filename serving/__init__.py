"""`tally serve`: gunicorn, in this process, with the settings of gunicorn.conf.py.

serving/gunicorn_conf.py is a symlink to the top-level gunicorn.conf.py, so `gunicorn app:app`
run from the repository and `tally serve` run from an installed or zipped Tally use one
configuration. Running gunicorn in-process (not as a `gunicorn` executable) is what lets a
single-file build serve: the workers are forks of this process.
"""

from __future__ import annotations

from gunicorn.app.base import Application

SETTINGS_MODULE = "python:serving.gunicorn_conf"


class TallyServer(Application):
    def __init__(self, overrides: dict):
        self.overrides = {name: value for name, value in overrides.items() if value is not None}
        super().__init__(usage=None, prog="tally serve")

    def init(self, parser, opts, args):
        return None

    def load_config(self):
        self.load_config_from_module_name_or_filename(SETTINGS_MODULE)
        for name, value in self.overrides.items():
            self.cfg.set(name, value)

    def load(self):
        from app import app

        return app


def serve(bind: str | None = None, workers: int | None = None) -> None:
    """Runs until gunicorn's master exits (SIGTERM drains and stops it)."""
    TallyServer({"bind": [bind] if bind else None, "workers": workers}).run()
