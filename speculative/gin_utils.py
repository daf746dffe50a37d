"""Gin registration of the project's configurable classes.

Runner modules (`speculative.train`, `speculative.infer`, `speculative.benchmark`) call
`register_configurables()` before parsing gin files; library modules never import gin. Each entry
of `CONFIGURABLES` is (python module, attribute, gin module), so `configs/models/t5_1_1_small.gin`
can say `t5_1_1_small/t5.T5Config.emb_dim = 512`. Add new configurables by appending to the list.
"""
from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Sequence

# (python module, attribute, gin module): registered as `<gin module>.<attribute>`.
CONFIGURABLES: list[tuple[str, str, str]] = [
    ('speculative.models.t5', 'T5Config', 't5'),
    ('speculative.models.t5', 'T5', 't5'),
]

_registered: set[tuple[str, str]] = set()


def register_configurables() -> None:
  """Registers every entry of `CONFIGURABLES` with gin (idempotent)."""
  import gin  # deferred: only runners need gin

  for module_name, attribute, gin_module in CONFIGURABLES:
    if (gin_module, attribute) in _registered:
      continue
    target = getattr(importlib.import_module(module_name), attribute)
    gin.external_configurable(target, attribute, module=gin_module)
    _registered.add((gin_module, attribute))


def load_macro(gin_file: str, macro: str, expected_type: type | None = None) -> Any:
  """The value a gin file binds to `macro` (e.g. EMBEDDED_TARGET in configs/models/*.gin), with
  configurable references evaluated. Clears the global gin config first."""
  import gin  # deferred: only runners need gin

  register_configurables()
  gin.clear_config()
  gin.parse_config_file(str(gin_file))
  value = gin.query_parameter(f'%{macro}')
  if isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  if expected_type is not None and not isinstance(value, expected_type):
    raise ValueError(f'{gin_file}: %{macro} is a {type(value).__name__}, not a '
                     f'{expected_type.__name__}')
  return value


def run_gin_main(fn: Callable[..., Any], name: str, description: str,
                 argv: Sequence[str] | None = None, log_level: int = logging.WARNING) -> Any:
  """The runners' command line: `--gin_file` (repeatable) and `--gin_bindings`, then `fn()`.

  `fn` is registered with gin as `name` (e.g. `infer`), so the gin files bind `name.arg = ...`.
  """
  import argparse

  import gin  # deferred: only runners need gin

  parser = argparse.ArgumentParser(description=description)
  parser.add_argument('--gin_file', action='append', required=True)
  parser.add_argument('--gin_bindings', action='append', default=[])
  args = parser.parse_args(argv)
  logging.basicConfig(level=log_level)
  register_configurables()
  configurable = gin.external_configurable(fn, name)
  gin.parse_config_files_and_bindings(args.gin_file, args.gin_bindings)
  return configurable()
