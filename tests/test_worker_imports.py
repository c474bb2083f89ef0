"""A worker imports only what it uses: the libraries of the dashboard (jinja2, argon2) and
of the Stripe webhook (stripe, requests) load on their first use, not with the app, and
prometheus-client when an app with /metrics on is made."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

LATER = ("stripe", "requests", "jinja2", "argon2", "prometheus_client")


def test_the_app_imports_without_the_libraries_of_pages_and_webhooks():
    script = ("import sys, app; app.create_app; "
              f"print(','.join(name for name in {LATER!r} if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=True)
    assert result.stdout.strip() == ""
