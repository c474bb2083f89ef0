"""gunicorn settings for bench/ceiling_app.py: Tally's own gunicorn.conf.py minus its hooks.

The hooks start and stop Tally's services, which the bare app does not have; every other
setting (worker class, timeouts, request limits) is taken from the real file so the
ceiling runs on the same gunicorn configuration.
"""

import runpy
import types
from pathlib import Path

_settings = runpy.run_path(str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py"))
globals().update({
    name: value for name, value in _settings.items()
    if not name.startswith("_") and not callable(value) and not isinstance(value, types.ModuleType)
})
