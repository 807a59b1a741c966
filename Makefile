# The two set-up commands of the README. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sanlab-installed

.PHONY: demo test test-fast clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# exactly this version: a CPU wheel is on the machine; anything else pulls a CUDA build
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sanlab demo

# --durations lists the slowest tests: the inner loop (test-fast) must stay under ~90 s, so a test that
# grows slow shows up here and gets the slow marker
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=10

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

clean-venv:
	rm -rf $(VENV)
