# The two set-up commands of the README. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sanlab-installed

.PHONY: demo test test-fast test-torch clean-venv gpu-check gpu-wheels

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
# grows slow shows up here and gets the slow marker. -n: pytest-xdist, one worker per core (TEST_WORKERS=0
# runs in this process, e.g. for pdb); every test sets one torch thread, so the workers do not oversubscribe.
# --dist loadfile: a file's tests run in one worker, in order, with its module fixtures built once.
# PYTHONDONTWRITEBYTECODE (set in some images) makes pytest rewrite the asserts of every test module and Python
# compile every module anew in each worker: collection took 14 s of CPU per worker with it, 5.5 s without
# (__pycache__/ is git-ignored). Unexported for every target of this file, not only the tests': the others
# (demo, test-torch, gpu-check) import the same modules and start faster with their bytecode cached too.
unexport PYTHONDONTWRITEBYTECODE
TEST_WORKERS ?= auto
XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadfile)
test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) --durations=10

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow" --durations=10

clean-venv:
	rm -rf $(VENV)

# The whole suite on another torch release than the project's (pyproject: torch>=2.5), in .venv-torch-VERSION-pyX.Y:
# `make test-torch TORCH=2.5.1`; another Python (pyproject: >=3.10) with PYTHON=, e.g. `make test-torch TORCH=2.13.0
# PYTHON=python3.12`. The registry has CUDA builds only (about 3 GB with their NVIDIA libraries); they run here on the
# CPU. results/torch-versions.md has what each release and Python gave.
TORCH ?= 2.5.1
test-torch: PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
test-torch: TORCH_VENV = .venv-torch-$(TORCH)-py$(PYTHON_VERSION)
test-torch:
	@test -n "$(PYTHON_VERSION)" || { echo "make test-torch: PYTHON=$(PYTHON) does not run" >&2; exit 2; }
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TORCH_VENV)/bin/python -m pip install --quiet torch==$(TORCH)
	$(TORCH_VENV)/bin/python -m pip install --quiet -e '.[dev]'
	$(TORCH_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider

# On a GPU machine (its own python3 with CUDA torch): pytest -m gpu, the GPU benchmarks and a Multi30k run in bf16,
# written to $$OUT or runs/gpu-check/gpu.md (scripts/gpu_check.sh says how to carry wheels and data there)
gpu-check:
	bash scripts/gpu_check.sh

# Here: the wheels a GPU image without network lacks (Python 3.12, x86-64), into .whl/ (git-ignored), each at
# this venv's version. sentencepiece too, although images have one: another version trains another subword
# vocabulary from the same texts and seed (0.2.2 and 0.2.3 do on Multi30k), so cells trained there would not be
# the grid's recipe (the compare table marks them §)
GPU_WHEELS := pydantic pydantic-core typing-inspection typing-extensions annotated-types conllu sentencepiece
gpu-wheels: $(STAMP)
	rm -rf .whl  # (a wheel of an earlier version beside the new one would stop the install there)
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		$(foreach p,$(GPU_WHEELS),$(p)==$$($(BIN)/python -m pip show $(p) | sed -n 's/^Version: //p'))
