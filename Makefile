# Routine actions. `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run install migrate demo serve test test-services test-browser lint schema-check format bench clean \
	bench-append bench-prefix-cache bench-context-latency bench-compaction bench-visual bench-recall \
	bench-embedding bench-quality bench-proxy bench-knowledge bench-events bench-soak bench-vectors

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py bootstrap_demo

# The server entry points default to production settings; this one is for development.
run: demo
	DJANGO_SETTINGS_MODULE=$${DJANGO_SETTINGS_MODULE:-config.django.local} \
	$(BIN)/uvicorn config.asgi:application --host $(HOST) --port $(PORT) --lifespan off

# The suites run on two processes (pytest-xdist), each test file on one of them, so a module's fixtures are
# built once; each process has a test database and a Redis database of its own (config/django/test.py).
# PYTEST_PARALLEL= runs them in one process.
PYTEST_PARALLEL ?= -n 2 --dist loadfile

# The suite with no services: SQLite in memory, local-memory cache, in-memory channels, eager Celery.
test: install
	env -u DATABASE_URL -u REDIS_URL $(BIN)/pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The admin in Chromium (tests/browser): fails, instead of skipping, without /usr/bin/chromium; a failing
# test leaves screenshots in var/test-reports/. MNEMO_DOC_SCREENSHOTS=1 also rewrites docs/img/.
test-browser: install
	env -u DATABASE_URL -u REDIS_URL MNEMO_BROWSER_REQUIRED=1 $(BIN)/pytest -q -m browser tests/browser \
		--junitxml=var/test-reports/browser.xml

# The suite against the local PostgreSQL and Redis.
test-services: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} $(BIN)/pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The API against its OpenAPI schema: schemathesis over every operation of the embedded server (.ci/schema-check).
schema-check: install
	.ci/schema-check

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# One command each; every benchmark prints its figures with a baseline measured in the same run.
bench-append: install
	$(BIN)/python bench/append.py

bench-prefix-cache: install
	$(BIN)/python bench/prefix_cache.py

bench-context-latency: install
	$(BIN)/python bench/context_latency.py

bench-compaction: install
	$(BIN)/python bench/compaction.py

bench-visual: install
	$(BIN)/python bench/visual.py

bench-embedding: install
	$(BIN)/python bench/embedding.py

# A synthetic smoke test (planted facts in generated chats); the quality claim is bench-quality's.
bench-recall: install
	$(BIN)/python bench/recall.py

# Evidence recall on public data (BEAM 128K) through the HTTP API, against a server it starts itself.
# Options (--var-dir DIR --keep: load once, ask many times; --url; --database-url) in the script's docstring.
bench-quality: install
	$(BIN)/python bench/evidence_recall.py

# The chat proxy's overhead over calling the upstream directly (10k-message conversation, granian, 2 workers).
bench-proxy: install
	$(BIN)/python bench/proxy.py

# Knowledge: code search quality on the installed Django package against plain BM25, ingest rates, search latency.
bench-knowledge: install
	$(BIN)/python bench/knowledge.py

# What an append pays to publish its event: the private publisher loop against the plain call, in memory and Redis.
bench-events: install
	$(BIN)/python bench/events.py

# numpy (exact, in process) against Milvus Lite at 100k and 1M vectors; --quick for 10k (BENCH_VECTORS_ARGS).
bench-vectors: install
	$(BIN)/python bench/vector_store.py $(BENCH_VECTORS_ARGS)

# Sustained mixed load on a real server, embedded (SQLite) then distributed (PostgreSQL, Redis, Celery): statuses,
# latencies, lost messages, seq gaps, embedding lag and backlog, memory. SOAK_ARGS="--short" runs 2 minutes each;
# the distributed run drops and creates SOAK_DATABASE_URL's database.
SOAK_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/mnemo_soak
SOAK_REDIS_URL ?= redis://127.0.0.1:6379/7
bench-soak: install
	$(BIN)/python bench/soak.py --database-url $(SOAK_DATABASE_URL) --redis-url $(SOAK_REDIS_URL) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) var
