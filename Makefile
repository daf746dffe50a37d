# The two commands (README quickstart):
#   make run    the main job on the embedded default: batch En-De translation, baseline vs speculative
#   make test   the test suite (after `make lint`: ruff check + ruff format --check, pyproject.toml)
#   make test-fast  the same without the tests marked slow, for iteration
# Both create .venv and install the package on first use, with the exact versions of constraints.txt;
# then run .venv/bin/python or the console scripts .venv/bin/speculative-{infer,train,benchmark}.
#   make install JAX_EXTRA=cuda12   the same, then jax's CUDA 12 build at the pinned jax version
#                                   (cuda13, tpu likewise; README, "GPUs and TPUs")
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The CPU kernels' library (speculative/kernels/), rebuilt when any of its C++ sources changes.
# Where it cannot be built (no g++, no FFI headers, not x86-64) the build prints one line and the
# package uses XLA's dot.
KERNEL_SOURCES := $(wildcard speculative/kernels/*.cc speculative/kernels/*.h speculative/kernels/*.inc)
KERNEL_STAMP := speculative/kernels/_kernels.so.sha256

# An accelerator build of jax, installed after the normal (CPU) install: `make install
# JAX_EXTRA=cuda12` (or cuda13, tpu) installs jax[$(JAX_EXTRA)] at the jax version constraints.txt
# pins, so jaxlib stays that version and only its GPU/TPU plugin is added. Empty (the default): the
# CPU install, unchanged.
JAX_EXTRA ?=
JAX_VERSION := $(shell sed -n 's/^jax==//p' constraints.txt)

.PHONY: run test test-fast lint install kernels clean

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]' -c constraints.txt
	touch $(STAMP)

$(KERNEL_STAMP): $(STAMP) $(KERNEL_SOURCES)
	$(PY) -m speculative.kernels.build

kernels: $(KERNEL_STAMP)

install: $(STAMP) $(KERNEL_STAMP)
ifneq ($(JAX_EXTRA),)
	$(PY) -m pip install -q 'jax[$(JAX_EXTRA)]==$(JAX_VERSION)' -c constraints.txt
endif

run: install
	$(PY) -m speculative.infer --gin_file=configs/local/run.gin

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint $(KERNEL_STAMP)
	$(PY) -m pytest -q -n 2 tests

# For iteration: every test but the slow tier (end-to-end kill soaks, full training runs; the
# `slow` marker, tests/conftest.py). `make test` runs everything.
test-fast: lint $(KERNEL_STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" tests

clean:
	rm -rf $(VENV)
