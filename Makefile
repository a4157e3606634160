# Every target that runs code installs the project first, so each works on a fresh machine.
PYTHON ?= python
# The CPU build of torch (a local wheel on the project's machines); GPU users: see README.
TORCH ?= torch==2.13.0
PIP_INSTALL = $(PYTHON) -m pip install --quiet --disable-pip-version-check
# The dev tools run from $(PYTHON)'s environment (python -m TOOL; import-linter has no -m, so its
# script from that environment's bin), never whichever copy is first on PATH.
SCRIPTS = $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_path('scripts'))")

.DEFAULT_GOAL := help
.PHONY: help install install-dev train test test-slow notebooks exercises screenshot lint imports deps format typecheck check toy-data clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

install:  ## install torch (CPU) and the package
	$(PIP_INSTALL) "$(TORCH)" -e .

install-dev:  ## install torch (CPU), the package and the dev tools
	$(PIP_INSTALL) "$(TORCH)" -e ".[dev]"

train: install  ## train the default model (additive attention, toy task)
	$(PYTHON) train.py $(ARGS)

test: install-dev  ## check the layers' imports and declared dependencies, then run the default test suite (what CI runs)
	$(SCRIPTS)/lint-imports
	$(PYTHON) -m deptry seq2seq
	$(PYTHON) -m pytest -q

test-slow: install-dev  ## run the slow end-to-end tests only (CI runs them after make test)
	$(PYTHON) -m pytest -q -m slow

notebooks: install-dev  ## notebooks/*.ipynb from their .py scripts (jupytext), executed with outputs, to commit
	cd notebooks && $(SCRIPTS)/jupytext --sync *.py && $(SCRIPTS)/jupyter execute --inplace *.ipynb && rm -rf runs

exercises: install-dev  ## notebooks/exercises/dist/NAME/: otter assign's student notebook and autograder zip of each exercise
	cd notebooks/exercises && for master in *.py; do name=$${master%.py}; \
	  mkdir -p dist/$$name && $(SCRIPTS)/jupytext --to ipynb -o dist/$$name/$$name.ipynb $$master && \
	  (cd dist/$$name && SEQ2SEQ_EXERCISE_TRAINING=0 $(SCRIPTS)/otter assign $$name.ipynb .) || exit 1; done

screenshot: install-dev  ## the README's explorer picture from PAGE (an explore.py page), as the browser tests draw it
	$(PYTHON) -m tests.explorer_pages $(PAGE) docs/explorer.png '.panel rect.cell[data-row="3"][data-col="2"]'

lint: install-dev  ## ruff lint and format check
	$(PYTHON) -m ruff check seq2seq tests scripts benchmarks train.py
	$(PYTHON) -m ruff format --check seq2seq tests scripts benchmarks train.py

imports: install-dev  ## import-linter: the layers of docs/architecture.md, no cycles, a reference without ctypes
	$(SCRIPTS)/lint-imports

deps: install-dev  ## deptry: every third-party import of seq2seq/ is declared in pyproject.toml
	$(PYTHON) -m deptry seq2seq

format: install-dev  ## apply ruff's formatting and safe fixes
	$(PYTHON) -m ruff check --fix seq2seq tests scripts benchmarks train.py
	$(PYTHON) -m ruff format seq2seq tests scripts benchmarks train.py

typecheck: install-dev  ## mypy over the package
	$(PYTHON) -m mypy seq2seq

check: lint typecheck test  ## everything CI and review expect (test runs imports and deps)

toy-data: install  ## write the toy task's splits to data/toy
	$(PYTHON) scripts/make_toy_data.py --out data/toy

clean:  ## remove caches (not runs: outputs/ and multirun/ are yours)
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
