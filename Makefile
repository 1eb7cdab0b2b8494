# The two commands of the README's quick start, and a few for developers.
# Each creates .venv on first use; nothing outside the checkout is touched.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench manifests constraints clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("outbox-relay needs Python >= 3.11; run with PYTHON=python3.12 (or similar)" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

## demo: install, then run the example application's mail story on an embedded PostgreSQL
demo: $(STAMP)
	$(BIN)/python -m examples.signin

## test: install, then lint, type-check and run the whole suite (PYTEST_WORKERS processes
## side by side, a test file each at a time, each with a database of its own;
## PYTEST_WORKERS=0 runs it in one)
PYTEST_WORKERS ?= 4
test: lint
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## docs: build the documentation site into site/, strictly (a broken link fails)
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## bench: throughput, pipeline, latency, producer and claim figures (see BENCHMARKS.md;
## python -m bench table, the ten-minute sustained load, runs on its own; python -m bench lists all)
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python -m bench throughput
	$(BIN)/python -m bench pipeline
	$(BIN)/python -m bench processes
	$(BIN)/python -m bench latency
	$(BIN)/python -m bench producers
	$(BIN)/python -m bench claim_latency

## manifests: regenerate k8s/ from the chart
manifests: $(STAMP)
	$(BIN)/python -m tools.manifests

## constraints: pin what the container image installs (constraints.txt), from a fresh venv
constraints:
	rm -rf $(VENV)-image
	$(PYTHON) -m venv $(VENV)-image
	$(VENV)-image/bin/python -m pip install --quiet --disable-pip-version-check '.[relay,mail,webhook,nats,amqp,redis,k8s,otel,binary]'
	{ sed -n '/^#/p' constraints.txt; $(VENV)-image/bin/python -m pip freeze --exclude outbox-relay; } > constraints.new
	mv constraints.new constraints.txt
	rm -rf $(VENV)-image

clean:
	rm -rf $(VENV) .outbox .mypy_cache .ruff_cache .pytest_cache site
