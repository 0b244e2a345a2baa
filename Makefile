# gpurace: `make run` and `make test` do all set-up on a fresh machine (a venv in .venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# What the main job needs (gpurace and its five dependencies), and what the tests need besides
# (the dev extra: pytest, Hypothesis, the schema checkers, Ray, matplotlib).
RUN_STAMP  := $(VENV)/.run-stamp
TEST_STAMP := $(VENV)/.test-stamp

.PHONY: install run test test-gpu test-gpu-core test-gpu-watch test-gpu-engine test-gpu-amplify \
        test-gpu-real test-pythons sweep sweep-timm bench bench-real clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(TEST_STAMP) $(RUN_STAMP)

install: $(RUN_STAMP)

# The main job: the safe smoke suite on the best backend here (sim when there is no GPU).
run: $(RUN_STAMP)
	$(BIN)/gpurace run smoke --backend auto

# The whole CPU suite (GPU tests are deselected by the `gpu` marker).
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q

# The CPU suite on the oldest and the newest Python gpurace supports (3.10, 3.13), each in a
# venv of its own, where this machine has them (pyenv's or on PATH); the others are named.
PYTHONS ?= 3.10 3.13
test-pythons:
	@for v in $(PYTHONS); do \
	  py=$$(ls $$HOME/.pyenv/versions/$$v*/bin/python$$v 2>/dev/null | head -1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v 2>/dev/null); \
	  if [ -z "$$py" ]; then echo "python$$v: not on this machine, not tested"; continue; fi; \
	  $$py -m venv .venv-$$v && .venv-$$v/bin/python -m pip install --quiet --upgrade pip && \
	  .venv-$$v/bin/python -m pip install --quiet -e '.[dev]' && \
	  .venv-$$v/bin/python -m pytest -q -p no:cacheprovider || exit 1; \
	done

# On a GPU machine with CuPy, pytest and the dependencies already installed: no venv, no installs.
# Four parts, each meant to fit ten minutes on an H200: the harness's own GPU tests, gpurace
# watch on real PyTorch and CuPy programs (tests/watch_programs), on what engines launch beyond
# ATen ops (tests/engine_programs: found, fixed twins clean, amplified, shrunk), and the watch
# programs amplified and shrunk to scenarios (GPURACE_AMPLIFY_TRIALS runs a program, 50 by
# default).
WATCH_GPU_TESTS := tests/test_watch_gpu.py tests/test_capture_cupy_gpu.py
ENGINE_GPU_TESTS := tests/test_engine_programs_gpu.py
AMPLIFY_GPU_TESTS := tests/test_amplify_gpu.py
REAL_GPU_TESTS := tests/test_real_programs_gpu.py
test-gpu: test-gpu-core test-gpu-watch test-gpu-engine test-gpu-amplify

test-gpu-core:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider tests \
	  $(addprefix --ignore=,$(WATCH_GPU_TESTS) $(ENGINE_GPU_TESTS) $(AMPLIFY_GPU_TESTS) \
	  $(REAL_GPU_TESTS))

test-gpu-watch:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider $(WATCH_GPU_TESTS)

# GPURACE_RECORD_DIR=tests/capture_recorded_engine records their captures for the CPU suite.
test-gpu-engine:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider $(ENGINE_GPU_TESTS)

test-gpu-amplify:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider $(AMPLIFY_GPU_TESTS)

# On a GPU machine with PyTorch and the corpus's libraries: gpurace watch on the real programs of
# tests/real_programs, each bare and watched (same exit, same answer, no finding).
# GPURACE_RECORD_DIR=tests/capture_recorded_real records their captures for the CPU replay.
test-gpu-real:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider $(REAL_GPU_TESTS)

# With a PYTHON that has PyTorch, expecttest and transformers: PyTorch's op and module databases
# (on DEVICE: cpu, or cuda on a GPU machine) and transformers' architectures (on the CPU), each
# bare and watched (same results bit for bit, every write said). Minutes; not CI's.
DEVICE ?= cpu
sweep:
	$(PYTHON) tests/op_sweep.py --device $(DEVICE)
	$(PYTHON) tests/op_sweep.py --device $(DEVICE) --grad
	$(PYTHON) tests/op_sweep.py --device $(DEVICE) --inference
	$(PYTHON) tests/op_sweep.py --device $(DEVICE) --modules
	$(PYTHON) tests/hf_sweep.py

# timm's image models (its whole zoo under 30M parameters: about 47 minutes of one CPU core).
sweep-timm:
	$(PYTHON) tests/timm_sweep.py

# On a GPU machine: copy batching, and the harness's trial rate against a bare CuPy loop.
bench:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m kvcore.bench
	PYTHONPATH=$(CURDIR) $(PYTHON) -m harness.bench

# On a GPU machine: the real programs bare, under TORCH_CUDA_SANITIZER and under gpurace watch
# (ARGS passes options on: make bench-real ARGS='--only NAME --repeats 1').
bench-real:
	PYTHONPATH=$(CURDIR) $(PYTHON) tests/real_programs/bench.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-3.* build *.egg-info .pytest_cache
