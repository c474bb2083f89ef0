"""gunicorn's logger, writing one JSON object per line when TALLY_LOG_FORMAT=json.

The `tally` logger reuses the error log's handlers (gunicorn.conf.py), so it follows.
"""

from __future__ import annotations

from gunicorn.glogging import Logger
from pythonjsonlogger.orjson import OrjsonFormatter

from config import Config, ConfigError

JSON_FIELDS = "{levelname}{name}{process}{message}"
RENAMED = {"levelname": "level", "name": "logger", "process": "pid"}


def json_formatter() -> OrjsonFormatter:
    return OrjsonFormatter(JSON_FIELDS, style="{", rename_fields=RENAMED, timestamp="time")


class TallyLogger(Logger):
    def setup(self, cfg):
        super().setup(cfg)
        try:
            log_format = Config.from_env().log_format
        except ConfigError:
            return  # on_starting refuses to start with the reason, on one line
        if log_format == "json":
            formatter = json_formatter()
            for log in (self.error_log, self.access_log):
                for handler in log.handlers:
                    handler.setFormatter(formatter)
