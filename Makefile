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

## test: install, then lint, type-check and run the whole suite
test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## docs: build the documentation site into site/, strictly (a broken link fails)
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## bench: throughput, pipeline, latency, producer and claim figures (see BENCHMARKS.md;
## bench/table.py, the ten-minute sustained load, runs on its own)
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/processes.py
	$(BIN)/python bench/latency.py
	$(BIN)/python bench/producers.py
	$(BIN)/python bench/claim_latency.py

## manifests: regenerate k8s/ from the chart
manifests: $(STAMP)
	$(BIN)/python -m tests.chart.render

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
