# Two commands for a newcomer: `make lab` (the course; `make course` is its headless form) and `make test`.
# Each one creates .venv and installs the pinned dependencies the first time (a few minutes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KERNEL := mgpu-course
NPROC  ?= 4

.PHONY: lab course test gpu-check mutation setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m ipykernel install --user --name $(KERNEL) --display-name "Python (mgpu-course)" >/dev/null
	@touch $(STAMP)
	@echo "environment ready: $(VENV) (Jupyter kernel '$(KERNEL)')"

# as root (containers, some clusters) Jupyter needs --allow-root
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

course: $(STAMP)
	MGPU_NPROC=$(NPROC) $(PY) -m mgpu_utils.course --out build notebooks

test: $(STAMP)
	$(PY) -m pytest

# The checks only a GPU can do (benchmarks/gpu_smoke.sh; torch already installed). SKIPPED without a GPU.
gpu-check:
	bash benchmarks/gpu_smoke.sh

# Mutation testing of the pure-computation modules (pyproject.toml [tool.mutmut]); not part of `make test`.
mutation: $(STAMP)
	$(PY) -m pip install --quiet "mutmut==3.8.1"
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 || true
	$(PY) benchmarks/mutation_report.py

clean:
	rm -rf build .pytest_cache mutants
