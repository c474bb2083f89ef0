"""gunicorn settings for bench/ceiling_app.py: Tally's own gunicorn.conf.py minus its hooks.

The hooks start and stop Tally's services, which the bare app does not have; every other
setting (timeouts, request limits) is taken from the real file. The worker class and its
threads are set here explicitly, to the values of Tally's file, so a `-k` given to the
command line cannot make the ceiling run another worker (gunicorn turns `-k sync` with
threads > 1 into gthread without a word) and the comparison stays on the same class.
"""

import runpy
import types
from pathlib import Path

_settings = runpy.run_path(str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py"))
globals().update({
    name: value for name, value in _settings.items()
    if not name.startswith("_") and not callable(value) and not isinstance(value, types.ModuleType)
})
worker_class = _settings["worker_class"]
threads = _settings["threads"]
