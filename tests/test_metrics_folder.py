"""The master's metrics folder: a dead worker's live gauges go, and nothing is imported in
gunicorn's SIGCHLD handler to do it (an import there that a second SIGCHLD interrupted
failed half-made, and the master exited 1 on SIGTERM)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_dead_workers_live_gauges_go_without_importing_prometheus_client(tmp_path):
    names = ["gauge_livesum_41.db", "gauge_liveall_41.db", "gauge_livemostrecent_41.db",
             "gauge_all_41.db", "counter_41.db", "gauge_livesum_410.db", "gauge_livesum_42.db"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    script = textwrap.dedent(f"""
        import sys
        from serving import metrics_folder
        metrics_folder.directory = {str(tmp_path)!r}
        metrics_folder.worker_gone(41)
        assert "prometheus_client" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "counter_41.db", "gauge_all_41.db", "gauge_livesum_410.db", "gauge_livesum_42.db"]
