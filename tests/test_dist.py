"""The one-file build: dist/tally.pyz built by `make dist`, copied alone into an empty
folder and run there with a python3 outside the project's venv: on its embedded default
(the SQLite file var/tally.db), and pointed at PostgreSQL by TALLY_DATABASE_URL."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import orjson
import pytest

from bench.dist import python3
from tests.conftest import REPO, WAIT, bearer, free_port, http

# Top-level names of the repository that are not part of the running service.
NOT_SHIPPED = {"tests", "bench", "scripts", "docs", "build", "dist", "clients", "gunicorn.conf"}
# The packaged copies of the top-level sources of truth (symlinks in the repository).
PACKAGED = {"storage/schema.sql": "schema.sql", "api/openapi.yaml": "docs/openapi.yaml",
            "serving/gunicorn_conf.py": "gunicorn.conf.py"}


def test_packaged_data_files_are_links_to_the_top_level_sources():
    for packaged, source in PACKAGED.items():
        path = REPO / packaged
        assert path.is_symlink(), f"{packaged} must be a symlink to {source}"
        assert path.resolve() == (REPO / source).resolve()


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    """dist/tally.pyz, built once per test run: by the first of make test's processes to
    need it, the others waiting for it (builds share the repository's build folder)."""
    run_folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_folder = run_folder.parent  # shared by this run's processes only
    out = run_folder / "dist-build" / "tally.pyz"
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            partial = out.with_suffix(".partial")
            proc = subprocess.run(["make", "--no-print-directory", "dist", f"PYZ={partial}"],
                                  cwd=REPO, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            partial.rename(out)
    return out


class Folder:
    """An empty folder holding only the built file, and a minimal environment to run it in."""

    def __init__(self, root: Path, artifact: Path, command: list[str]):
        self.root = root
        shutil.copy2(artifact, root / artifact.name)
        self.command = command
        # HOME is where shiv unpacks its site-packages once (~/.shiv).
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(root / "home"), "LANG": "C.UTF-8"}

    def tally(self, *args: str) -> dict:
        proc = subprocess.run([*self.command, *args, "--json"], cwd=self.root,
                              env=self.env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"tally {args}: {proc.stderr}"
        return orjson.loads(proc.stdout)


def database_url(request, backend: str) -> str | None:
    """None for the build's embedded default; else the URL of the test's own schema."""
    return request.getfixturevalue("postgres_schema") if backend == "postgres" else None


@pytest.mark.slow
def test_the_one_file_build_serves_from_an_empty_folder(pyz, tmp_path, request, backend):
    (tmp_path / "empty").mkdir()
    exercise(Folder(tmp_path / "empty", pyz, [python3(), "tally.pyz"]), tmp_path,
             database_url(request, backend))


@pytest.mark.slow
def test_the_binary_build_serves_from_an_empty_folder(tmp_path, request, backend):
    """`make dist-binary` (PyInstaller, no Python needed) passes the same test; it takes
    minutes to build, so `make test-dist-binary` builds it and runs this with its path."""
    built = os.environ.get("TALLY_TEST_DIST_BINARY")
    if not built:
        pytest.skip("the binary build is tested by `make test-dist-binary`")
    (tmp_path / "empty").mkdir()
    exercise(Folder(tmp_path / "empty", Path(built), ["./" + Path(built).name]), tmp_path,
             database_url(request, backend))


def exercise(folder: Folder, tmp_path: Path, url: str | None) -> None:
    """init, serve, an event and a payment read back, SIGTERM, then `tally check`; on the
    default SQLite file, or on PostgreSQL at `url`."""
    assert len(list(folder.root.iterdir())) == 1
    if url is not None:
        folder.env["TALLY_DATABASE_URL"] = url
    assert folder.tally("init")["ok"]
    assert (folder.root / "var" / "tally.db").is_file() == (url is None)
    account = folder.tally("account", "create", "--name", "One File")
    site = folder.tally("site", "create", "--account", account["id"], "--host", "one.example")
    key = folder.tally("key", "create", "--site", site["id"], "--scope", "events", "--scope",
                       "payments", "--scope", "read")["key"]

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen([*folder.command, "serve", "--bind", f"127.0.0.1:{port}",
                               "--workers", "2"], cwd=folder.root, env=folder.env, stdout=log,
                              stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while not _up(base):
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        headers = {**bearer(key), "Content-Type": "application/json"}
        event = {"s": site["id"], "e": "pageview", "u": "https://one.example/pricing",
                 "ip": "81.2.69.160", "ua": "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0"}
        assert http("POST", base + "/api/v1/events", orjson.dumps(event), headers)[0] == 204
        payment = {"payment_id": "pay_one", "amount": 12.5, "currency": "EUR", "kind": "charge",
                   "paid_at": "2026-09-21T14:00:00Z", "customer": {"id": "cus_one"}}
        status, _, body = http("POST", base + "/api/v1/payments", orjson.dumps(payment), headers)
        assert status == 200, body
        status, _, body = http("GET", base + "/api/v1/payments/pay_one", None, bearer(key))
        assert status == 200, body
        assert orjson.loads(body)["data"]["amount"] == 12.5
        status, _, body = http("GET", base + "/api/v1/openapi.json")
        assert status == 200 and orjson.loads(body)["openapi"].startswith("3.")
        # Other packages' data files ship too: the dashboard's templates, the script.
        status, _, body = http("GET", base + "/login")
        assert status == 200 and b"<form" in body
        status, _, body = http("GET", base + "/js/tally.js")
        assert status == 200 and body == (REPO / "tracker" / "static" / "tally.js").read_bytes()
        # No user yet: the master printed the first run's setup link once, and it opens.
        log.flush()
        printed = (tmp_path / "serve.log").read_text()
        assert printed.count("no user yet") == 1, printed
        setup = re.search(r"Open (\S+) within 24 hours", printed).group(1)
        assert setup.startswith(base + "/setup/")
        status, _, body = http("GET", setup)
        assert status == 200 and b'name="host"' in body
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(WAIT)
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()
    # The queue was drained on SIGTERM: the event is on disk and the database checks out.
    traffic = folder.tally("report", "traffic", "--site", site["id"])
    assert traffic["aggregate"]["pageviews"] == 1, traffic
    assert folder.tally("check")["ok"]


def _up(base: str) -> bool:
    try:
        return http("GET", base + "/healthz")[0] == 200
    except OSError:
        return False


def test_the_build_holds_every_run_time_module_and_the_packaged_sources(pyz):
    with zipfile.ZipFile(pyz) as archive:
        names = archive.namelist()
        for packaged, source in PACKAGED.items():
            assert archive.read(f"site-packages/{packaged}") == (REPO / source).read_bytes()
    shipped = {name.split("/")[1].removesuffix(".py") for name in names
               if name.startswith("site-packages/") and name.count("/") >= 1}
    in_repo = {p.name.removesuffix(".py") for p in REPO.iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").is_file()) and not p.name.startswith(".")}
    missing = in_repo - NOT_SHIPPED - shipped
    assert not missing, (f"{sorted(missing)} would be missing from dist/tally.pyz: add them to "
                         "setup.cfg (py_modules or packages.find include), or to NOT_SHIPPED here")


UNIT = REPO / "docs" / "deploy" / "systemd" / "tally.service"


def unit_settings() -> list[tuple[str, str]]:
    settings = []
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            name, _, value = line.partition("=")
            settings.append((name, value))
    return settings


def test_the_systemd_unit_verifies():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    settings = dict(unit_settings())
    for wanted in ("ProtectSystem", "ReadWritePaths", "Restart", "User", "NoNewPrivileges"):
        assert wanted in settings, wanted
    assert (settings["ProtectSystem"], settings["Restart"]) == ("strict", "on-failure")
    proc = subprocess.run([tool, "verify", str(UNIT)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if "tally.service" in line]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.sqlite_only  # the unit as shipped: its TALLY_DB under /var/lib/tally
def test_the_systemd_command_lines_run_the_one_file(pyz, tmp_path):
    """ExecStartPre and ExecStart as the unit has them, with its Environment, against
    the built file: only the paths (and the port) move into the test's folder."""
    port = free_port()
    moves = {"/opt/tally/tally.pyz": str(tmp_path / "opt" / "tally.pyz"),
             "/var/lib/tally": str(tmp_path / "state"), "/var/cache/tally": str(tmp_path / "cache"),
             "127.0.0.1:8000": f"127.0.0.1:{port}", "/usr/bin/python3": python3()}

    def moved(text: str) -> str:
        for old, new in moves.items():
            text = text.replace(old, new)
        return text

    (tmp_path / "opt").mkdir()
    (tmp_path / "state").mkdir()
    shutil.copyfile(pyz, tmp_path / "opt" / "tally.pyz")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    commands = {}
    for name, value in unit_settings():
        if name == "Environment":
            key, _, val = value.partition("=")
            env[key] = moved(val)
        elif name in ("ExecStartPre", "ExecStart", "WorkingDirectory"):
            commands[name] = moved(value)
    assert env["TALLY_DB"].startswith(str(tmp_path)) and "SHIV_ROOT" in env
    cwd = commands["WorkingDirectory"]
    subprocess.run(shlex.split(commands["ExecStartPre"]), cwd=cwd, env=env, check=True,
                   capture_output=True, timeout=120)
    log = open(tmp_path / "unit.log", "wb")
    server = subprocess.Popen(shlex.split(commands["ExecStart"]), cwd=cwd, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT
        while not _up(f"http://127.0.0.1:{port}"):
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "unit.log").read_text()
            time.sleep(0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(WAIT)
        log.close()
    assert code == 0
    lines = (tmp_path / "unit.log").read_text().splitlines()
    assert lines and all(orjson.loads(line)["level"] for line in lines if line.strip())
    assert list((tmp_path / "cache").iterdir()), "shiv unpacked into SHIV_ROOT"
