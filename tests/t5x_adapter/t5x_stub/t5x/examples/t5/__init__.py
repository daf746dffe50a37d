"""Stub of `t5x.examples.t5` (tests/t5x_adapter/t5x_stub/t5x/__init__.py)."""
