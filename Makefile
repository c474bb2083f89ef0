# Tally. `make run` serves on the embedded SQLite default; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BIND ?= 127.0.0.1:8000
WORKERS ?= 2

.PHONY: install run test lint bench fuzz soak clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

run: install
	$(BIN)/tally init
	$(BIN)/gunicorn --bind $(BIND) --workers $(WORKERS) app:app

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) var .pytest_cache *.egg-info
