# Quickstart: `make demo` then `make test`.
PYTHON ?= python3

# Inside the container (docker/Dockerfile sets SELCL_CONTAINER=1) every target uses the
# image's environment (/opt/venv, with the repo on PYTHONPATH): the host's .venv is
# mounted with the repo but its interpreter does not exist in the image.
ifdef SELCL_CONTAINER
BIN   := $(VIRTUAL_ENV)/bin
STAMP :=
else
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
endif
# stages run `python` and `dvc` from PATH: this environment's
RUN := PATH="$(abspath $(BIN)):$$PATH"

.PHONY: demo paper test bench venv lint gpu-check

ifndef SELCL_CONTAINER
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)
endif

venv: $(STAMP)

## The demo suite (scikit-learn digits, small network, CPU) as the DVC experiment `demo`
## (tools/demo.py): params.yaml, dvc.lock, runs/ and reports/ stay as committed; the
## report is copied to demo/README.md.
demo: $(STAMP)
	$(RUN) $(BIN)/python tools/demo.py

## The paper suite: params.yaml `run` (needs a CUDA GPU; in the container: docker/run.sh make paper).
paper: $(STAMP)
	$(RUN) $(BIN)/dvc repro
	@echo "Report: $(CURDIR)/reports/README.md"

## Two workers, one per core of the 2-core machines CI runs on: the longest tests wait on
## single-threaded DVC subprocesses, so the two halves overlap. `--dist loadfile` keeps
## a test file in one worker, so its module fixtures (the demo repository, the trained
## digits run) are built once; `--no-loadscope-reorder` hands the files out longest first
## (tests/conftest.py, LONGEST_FIRST). `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(RUN) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

## Every CUDA path once on a small real run, one PASS/FAIL line each, and the projected
## CIFAR-10 epoch and setting time (tools/gpu_check.py; meant for < 5 min on one GPU). Run it
## first on a new machine or image: docker/run.sh make gpu-check. Without CUDA (or with
## SELCL_DEVICE=cpu) the same items on the CPU, the CUDA-only ones marked SKIP.
gpu-check: $(STAMP)
	$(RUN) $(BIN)/python tools/gpu_check.py

## CPU-sized benchmarks (on a CUDA machine: bench/gpu.sh path/to/cifar10-jpeg.tar.gz).
bench: $(STAMP)
	$(BIN)/python bench/selection.py
	$(BIN)/python bench/step.py --arch small --batch 64 --iters 10

## The container: lint the Dockerfile and check that its pinned requirements resolve.
## On the host (hadolint comes with the dev extras, which the image does not install).
lint: $(STAMP)
ifdef SELCL_CONTAINER
	@echo "make lint checks the container from the host: run it outside docker/run.sh" >&2; exit 2
endif
	$(BIN)/hadolint docker/Dockerfile
	$(BIN)/pip install --dry-run --ignore-installed --quiet -r docker/requirements-gpu.txt
