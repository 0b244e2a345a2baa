# gpurace: `make run` and `make test` do all set-up on a fresh machine (a venv in .venv).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install run test test-gpu bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The main job: the safe scenarios on the best backend here (sim when there is no GPU).
run: $(STAMP)
	$(BIN)/gpurace run smoke --backend auto

# The whole CPU suite (GPU tests are deselected by the `gpu` marker).
test: $(STAMP)
	$(BIN)/python -m pytest -q

# On a GPU machine with CuPy, pytest and the dependencies already installed: no venv, no installs.
test-gpu:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -s -m gpu -p no:cacheprovider tests

# On a GPU machine: copy batching, and the harness's trial rate against a bare CuPy loop.
bench:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m kvcore.bench
	PYTHONPATH=$(CURDIR) $(PYTHON) -m harness.bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
