# The two commands (README quickstart):
#   make run    the main job on the embedded default: batch En-De translation, baseline vs speculative
#   make test   the test suite (after `make lint`: ruff check + ruff format --check, pyproject.toml)
# Both create .venv and install the package on first use, with the exact versions of constraints.txt;
# then run .venv/bin/python or the console scripts .venv/bin/speculative-{infer,train,benchmark}.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' -c constraints.txt
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m speculative.infer --gin_file=configs/local/run.gin

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV)
