"""`make bench` (and `make bench-dist`): the one-file build's size and how long it takes to
start, measured, never judged.

    .venv/bin/python -m bench.dist

Builds dist/tally.pyz into a temporary folder with `make dist`, then, with a python3 outside
the venv and an empty SHIV_ROOT: `tally.pyz init` the first time (shiv unpacks its
dependencies), `tally.pyz init` again (unpacked), and `tally.pyz serve` from launch to the
first 200 of /healthz.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python3() -> str:
    """Debian's python3 when it has our minor version, else the interpreter the venv was made from."""
    system = "/usr/bin/python3"
    if os.access(system, os.X_OK):
        version = subprocess.run([system, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout.strip()
        if version == str(tuple(sys.version_info[:2])):
            return system
    return sys._base_executable


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, **kwargs)
    return time.perf_counter() - started


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tally-dist-bench-") as folder:
        root = Path(folder)
        pyz = root / "tally.pyz"
        build_s = timed(["make", "--no-print-directory", "dist", f"PYZ={pyz}"], cwd=REPO)
        size = pyz.stat().st_size
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SHIV_ROOT": str(root / "shiv"),
               "TALLY_DB": str(root / "tally.db")}
        command = [python3(), str(pyz)]
        first_s = timed([*command, "init"], env=env, cwd=root)
        warm_s = timed([*command, "init"], env=env, cwd=root)
        port = free_port()
        started = time.perf_counter()
        server = subprocess.Popen([*command, "serve", "--bind", f"127.0.0.1:{port}", "--workers", "2"],
                                  env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve_s = None
        try:
            while server.poll() is None and time.perf_counter() - started < 60:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                        if resp.status == 200:
                            serve_s = time.perf_counter() - started
                            break
                except OSError:
                    time.sleep(0.02)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    print("dist/tally.pyz (shiv, compressed)")
    print(f"  size                        {size / 1_048_576:.1f} MiB ({size} bytes)")
    print(f"  build (make dist)           {build_s:.1f} s")
    print(f"  first run, unpacking: init  {first_s:.2f} s")
    print(f"  unpacked: init              {warm_s:.2f} s")
    print(f"  serve to first /healthz 200 {serve_s:.2f} s" if serve_s else "  serve: no answer in 60 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
