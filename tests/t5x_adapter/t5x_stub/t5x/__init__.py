"""A test stub of t5x (NOT t5x): the few T5X interfaces `speculative.t5x_adapter` calls.

t5x is not on PyPI, so CI cannot install it. This package lets the adapter's own code (models.py,
rows.py, the gin run file configs/t5x/speculative.gin) run in CI; it is put on `sys.path` only by
the `t5x_stub` fixture of tests/t5x_adapter/test_t5x_adapter_stub.py (and by the subprocess of
`test_rest_of_package_never_imports_t5x`), never by the package. Written for these tests from the
signatures of google-research/t5x (commit cc342d41, the one tests/fixtures/t5x_tiny was written
with); no T5X code is copied. What it provides and what only real t5x checks:
tests/t5x_adapter/README.md.
"""

IS_TEST_STUB = True
