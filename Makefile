# Quickstart: `make demo` then `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo paper test bench venv lint

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The demo suite (scikit-learn digits, small network, CPU) through DVC.
demo: $(STAMP)
	$(BIN)/python tools/use_suite.py demo
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro
	@echo ""
	@echo "Report: $(CURDIR)/reports/README.md"

## The paper suite (needs a CUDA GPU; run inside the container: docker/run.sh make paper).
paper: $(STAMP)
	$(BIN)/python tools/use_suite.py paper
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro
	@echo "Report: $(CURDIR)/reports/README.md"

test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q

## CPU-sized benchmarks (on a CUDA machine: bench/gpu.sh path/to/cifar10-jpeg.tar.gz).
bench: $(STAMP)
	$(BIN)/python bench/selection.py
	$(BIN)/python bench/step.py --arch small --batch 64 --iters 10

## The container: lint the Dockerfile and check that its pinned requirements resolve.
lint: $(STAMP)
	$(BIN)/hadolint docker/Dockerfile
	$(BIN)/pip install --dry-run --ignore-installed --quiet -r docker/requirements-gpu.txt
