"""Tally's app with a clock the test sets, for a real gunicorn (`app="tests.clocked_app:app"`).

TEST_CLOCK_FILE names a file holding unix seconds (tests.lifecycle.ClockFile writes it);
every worker reads it whenever the app asks for the time, so a test can walk a service
through weeks in a minute. Only the clock is replaced: everything else is `app.create_app`
with the settings of the environment, as `app:app` has them.
"""

from __future__ import annotations

import os

from app import create_app
from config import Config


class FileClock:
    def __init__(self, path: str):
        self.path = path

    def __call__(self) -> float:
        with open(self.path) as handle:
            return float(handle.read())


app = create_app(Config.from_env(), clock=FileClock(os.environ["TEST_CLOCK_FILE"]))
