# Two commands for a newcomer: `make lab` (the course; `make course` is its headless form) and `make test`.
# Each one creates .venv and installs the pinned dependencies the first time (a few minutes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KERNEL := mgpu-course
NPROC  ?= $(or $(MGPU_NPROC),4)

.PHONY: lab lab-config course slides class-copy test test-floor gpu-check mutation setup clean

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

# A quiet start: kernels talk over local IPC sockets, not TCP (so ipykernel has no unencrypted port to
# warn about), JupyterLab does not ask about fetching news, and the committed notebooks are trusted.
# The sockets live in a short private folder: a socket path may not exceed 107 bytes, and Jupyter's
# runtime folder under a long home directory would.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
LAB_SOCKETS  := $(or $(XDG_RUNTIME_DIR),/tmp)/mgpu-lab-$(shell id -u)
LAB_FLAGS    := --notebook-dir=notebooks --KernelManager.transport=ipc --KernelManager.ip=$(LAB_SOCKETS)/kernel

lab-config: $(STAMP)
	@mkdir -p -m 700 $(LAB_SOCKETS)
	@test -O $(LAB_SOCKETS) || { echo "$(LAB_SOCKETS) belongs to another user: set XDG_RUNTIME_DIR to a private folder"; exit 1; }
	@mkdir -p $(LAB_SETTINGS)
	@cp jupyter/overrides.json $(LAB_SETTINGS)/overrides.json
	@$(VENV)/bin/jupyter trust notebooks/*.ipynb >/dev/null

lab: lab-config
	MGPU_NPROC=$(NPROC) $(VENV)/bin/jupyter lab $(LAB_FLAGS) $(ROOT_FLAG) $(LAB_ARGS)

# Two lessons at a time, each in its own kernel (COURSE_JOBS=1: one at a time, as a student runs them)
COURSE_JOBS ?= 2
course: $(STAMP)
	MGPU_NPROC=$(NPROC) $(PY) -m mgpu_utils.course --jobs $(COURSE_JOBS) --out build notebooks

# A copy of the course for students, without the worked solutions (exercises/solutions/) and the graders' tests
# (tests/grading/): the graders compare with PyTorch, not with them. The copy is the last commit (git archive HEAD),
# checked for any worked solution's lines (mgpu_utils/grading/class_copy.py; standard library only, so any
# Python 3 runs it). make class-copy DEST=../students
class-copy:
	@test -n "$(DEST)" || { echo "usage: make class-copy DEST=folder (a new or empty folder)"; exit 2; }
	@$(or $(wildcard $(PY)),$(PYTHON)) -m mgpu_utils.grading.class_copy "$(DEST)"

# Each lesson as a slide deck (headings, text and figures; from the stored outputs, nothing runs): build/slides/
slides: $(STAMP)
	$(PY) -m mgpu_utils.course --slides --out build/slides notebooks

# Two worker processes (pytest-xdist): a lesson in the browser or a launch waits on its ranks' start-up and leaves a
# core idle; the other worker fills it. Then, alone, the tests of timing claims (marker timing_claims: asserted
# only on a quiet machine, which beside another worker it is not). Both parts run; either failing fails make test.
# TEST_WORKERS=0 runs the whole suite in one process (pytest alone does too).
TEST_WORKERS ?= 2
test: $(STAMP)
ifeq ($(TEST_WORKERS),0)
	$(PY) -m pytest
else
	@rc=0; $(PY) -m pytest -n $(TEST_WORKERS) --dist load -m "not timing_claims" || rc=$$?; \
	echo "make test: the timing claims, alone"; $(PY) -m pytest -m timing_claims tests || rc=$$?; exit $$rc
endif

# The oldest torch the course supports (mgpu_utils.compat.OLDEST_TORCH), from PyPI with its torchvision: the
# in-process tests and the launches of the compat, collectives, DDP and model-parallel tests (the library's pipeline
# schedules and DTensor: what broke on 2.9.1), in a second environment (.venv-floor) with the course's pins but
# those two, and no JupyterLab or Playwright. An API drift guard; .ci/run runs it after make test.
FLOOR_TORCH       ?= 2.10.0
FLOOR_TORCHVISION ?= 0.25.0
FLOOR_VENV        := .venv-floor
FLOOR_SKIP        := torch torchvision jupyterlab playwright
FLOOR_LAUNCHES    := tests/package/test_compat.py tests/lessons/test_04_collectives.py tests/lessons/test_03_ddp.py \
                     tests/lessons/test_05_model_parallel.py
# PyPI's torch 2.10 is a CUDA build: about 6 GB in .venv-floor, downloaded without keeping a second copy in pip's
# cache (--no-cache-dir). FLOOR_NEED_GB is checked first, so a full disk says so instead of pip's "Errno 28".
FLOOR_NEED_GB     ?= 9
test-floor:
	@free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); [ -x $(FLOOR_VENV)/bin/python ] || [ $$free -ge $(FLOOR_NEED_GB) ] || \
	  { echo "make test-floor: $$free GB free here, the torch $(FLOOR_TORCH) environment needs about $(FLOOR_NEED_GB) GB (free disk, then run it again)"; exit 3; }
	@test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --no-cache-dir torch==$(FLOOR_TORCH) torchvision==$(FLOOR_TORCHVISION) \
	  $$($(PYTHON) -c "import tomllib; \
	  deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
	  print(' '.join(d for d in deps if d.split('==')[0] not in '$(FLOOR_SKIP)'.split()))")
	PYTHONPATH=$(CURDIR) $(FLOOR_VENV)/bin/python -m pytest -p no:cacheprovider -o addopts="-ra --timeout 600" \
	  tests -m "not launches" --ignore tests/repo/test_browser.py --ignore tests/repo/test_packaging.py
	PYTHONPATH=$(CURDIR) $(FLOOR_VENV)/bin/python -m pytest -p no:cacheprovider -o addopts="-ra --timeout 600" \
	  $(FLOOR_LAUNCHES) -m launches

# The checks only a GPU can do (benchmarks/gpu_smoke.py; a CUDA torch already installed, nothing else of ours needed:
# .venv's Python if there is one, else python3). SKIPPED without a GPU; ARGS=--dry-run lists the steps.
gpu-check:
	$$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 ) benchmarks/gpu_smoke.py $(ARGS)

# Mutation testing of the pure-computation modules (pyproject.toml [tool.mutmut]); not part of `make test`.
mutation: $(STAMP)
	$(PY) -m pip install --quiet "mutmut==3.8.1"
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2 || true
	$(PY) benchmarks/mutation_report.py

clean:
	rm -rf build .pytest_cache mutants
