# Tally. `make run` serves on the embedded SQLite default; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BIND ?= 127.0.0.1:8000
WORKERS ?= 2

.PHONY: install system-deps run test test-browsers test-loaded lint bench bench-dist bench-reads bench-hosts fuzz clean dist dist-binary test-dist-binary

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml clients/python/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# compat mode puts the repo root on sys.path, so packages added later import
	# without reinstalling. The client library (clients/python) is tested against the
	# server in make test, so it is installed beside it.
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		--config-settings editable_mode=compat -e '.[test]' -e clients/python
	touch $@

run: install
	$(BIN)/tally init
	$(BIN)/tally serve --bind $(BIND) --workers $(WORKERS)

# One file, dist/tally.pyz, that runs with python3 of the same minor version on Linux
# x86_64 (orjson and google-re2 are compiled wheels): `python3 tally.pyz serve`. shiv
# builds it with pip, from the pip cache or PyPI; tests/test_dist.py builds and runs it.
PYZ ?= dist/tally.pyz
dist: install
	@mkdir -p $(dir $(PYZ))
	@rm -rf build/lib  # setuptools would reuse stale files of an earlier build
	$(BIN)/shiv --quiet --compressed --reproducible --entry-point cli:main \
		--python '/usr/bin/env python3' --output-file $(PYZ) . >/dev/null
	@ls -l $(PYZ)

# dist/tally: one executable that needs no Python at all (PyInstaller --onefile, Linux
# x86_64, glibc at least the build machine's). Built in its own venv (build/binary-venv), in
# several minutes; `make test-dist-binary` builds it and runs tests/test_dist.py's scenario
# on it. Every package with run-time data or dynamic imports is collected whole.
BINARY ?= dist/tally
BINARY_VENV := build/binary-venv
BINARY_PACKAGES := app cli config vocabulary storage api attribution tracker dashboard \
	metrics serving quota enrichment ingest reports validation \
	iso4217 pycountry iptocc crawlerdetect re2 ua_parser ua_parser_builtins falcon \
	gunicorn stripe jinja2 argon2 prometheus_client pythonjsonlogger psycopg psycopg_binary psycopg_pool
dist-binary:
	test -x $(BINARY_VENV)/bin/python || $(PYTHON) -m venv $(BINARY_VENV)
	$(BINARY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check . pyinstaller==6.22.3
	rm -rf build/pyinstaller
	$(BINARY_VENV)/bin/pyinstaller --onefile --noconfirm --log-level ERROR --name $(notdir $(BINARY)) \
		--distpath $(dir $(BINARY)) --workpath build/pyinstaller --specpath build/pyinstaller \
		--hidden-import serving.gunicorn_conf --hidden-import serving.logs \
		$(foreach package,$(BINARY_PACKAGES),--collect-all $(package)) \
		$(CURDIR)/scripts/tally_binary.py
	@ls -l $(BINARY)

test-dist-binary: install dist-binary
	TALLY_TEST_DIST_BINARY=$(abspath $(BINARY)) $(BIN)/python -m pytest -q \
		tests/test_dist.py::test_the_binary_build_serves_from_an_empty_folder

# Headless Chromium, its driver, nginx, pgbouncer and wrk (the bench harness's end-to-end tests) for
# the real-part tests: installed through apt when root or sudo allows; required under
# CI=true, otherwise their tests skip loudly.
system-deps:
	@bash scripts/system-deps.sh wrk

# The suite in PYTEST_WORKERS processes (an idle one takes tests from a busy one), on both
# backends: PostgreSQL at TALLY_TEST_DATABASE_URL (README). Twice the 2 cores: many tests
# wait on a server, a subprocess or PostgreSQL, and a fourth process fills those waits
# (quiet, 2026-11-27: 3 processes 5:11, 4 processes 4:39; docs/DEVELOPING.md).
PYTEST_WORKERS ?= 4
# The suite starts hundreds of Python processes (`tally`, gunicorn, read processes) on the
# same sources: where the environment sets PYTHONDONTWRITEBYTECODE (this project's shared
# machines do), each compiled them again and each pytest process rewrote every test module's
# asserts again, about 6 % of the suite's CPU. The suite writes its bytecode (__pycache__,
# ignored by git) whatever the caller's environment says.
SUITE_ENV := PYTHONDONTWRITEBYTECODE=
test: install system-deps
	$(SUITE_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The tests in headless Chromium on both backends (make test runs them on SQLite only:
# tests/conftest.py BROWSER_BACKENDS).
test-browsers: install system-deps
	BROWSER_BACKENDS="sqlite postgres" $(SUITE_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) \
		--dist worksteal -m browser

# The whole suite while stress-ng keeps LOAD_FACTOR x cores CPU-bound processes busy
# (scripts/test-loaded.sh; stress-ng is installed through apt like system-deps).
LOAD_FACTOR ?= 2
test-loaded: install
	@bash scripts/system-deps.sh stress-ng
	@LOAD_FACTOR=$(LOAD_FACTOR) MAKE="$(MAKE)" PYTEST_WORKERS=$(PYTEST_WORKERS) bash scripts/test-loaded.sh

lint: install
	$(BIN)/ruff check .

# A long random run of the property tests and of schemathesis against a live gunicorn
# (make test runs both with a fixed seed and a few hundred cases, schemathesis's coverage
# phase on PostgreSQL only: tests/test_fuzz.py). FUZZ_EXAMPLES=n per test.
FUZZ_EXAMPLES ?= 2000
fuzz: install
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_properties.py tests/test_fuzz.py

# Reports figures, never fails on them (bench/run.py). Needs wrk, installed through apt
# like system-deps when missing.
# PostgreSQL's figures need a server at TALLY_BENCH_DATABASE_URL (default the test server's
# URL); without one they are recorded as skipped.
WRK ?= wrk
bench:
	@command -v $(WRK) >/dev/null 2>&1 || bash scripts/system-deps.sh wrk
	@command -v $(WRK) >/dev/null 2>&1 || { echo "make bench needs wrk: apt-get install wrk" >&2; exit 1; }
	@$(MAKE) --no-print-directory install
	$(BIN)/python -m bench.run --workers $(WORKERS) --wrk $(WRK) --readme
	@$(MAKE) --no-print-directory bench-dist

# The worst reads within the documented limits over 1,000,000 events, alone and ten at once
# against ingestion's p99 (bench/reads.py, several minutes); make bench runs it too.
# READS_BACKENDS=sqlite postgres for both.
READS_BACKENDS ?= sqlite
bench-reads:
	@command -v $(WRK) >/dev/null 2>&1 || bash scripts/system-deps.sh wrk
	@command -v $(WRK) >/dev/null 2>&1 || { echo "make bench-reads needs wrk: apt-get install wrk" >&2; exit 1; }
	@$(MAKE) --no-print-directory install
	$(BIN)/python -m bench.reads --backend $(READS_BACKENDS)

# One host's flush thread against two hosts' (processes, a site each) storing into one
# PostgreSQL (bench/parallel_flush.py, a few minutes); needs no wrk. EVENTS per host.
EVENTS ?= 50000
bench-hosts: install
	$(BIN)/python -m bench.parallel_flush --events $(EVENTS)

# The one-file build's size and start times (bench/dist.py); needs no wrk.
bench-dist: install
	$(BIN)/python -m bench.dist

clean:
	rm -rf $(VENV) var .pytest_cache *.egg-info build dist
