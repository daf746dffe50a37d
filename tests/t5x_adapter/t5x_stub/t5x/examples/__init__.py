"""Stub of `t5x.examples` (tests/t5x_adapter/t5x_stub/t5x/__init__.py)."""
