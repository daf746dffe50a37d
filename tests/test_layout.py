"""The package layout's promises (docs/design.md, section 1): a few modules beside the packages,
and the flat module paths of earlier versions still importing, from Python and from a gin file."""

import importlib
from pathlib import Path

import gin
import pytest

REPO = Path(__file__).resolve().parents[1]

MOVED = [
  ('speculative.decoding', 'speculative.decode.loops'),
  ('speculative.spectr_decoding', 'speculative.spectr.decoding'),
  ('speculative.params_files', 'speculative.checkpoints.params_files'),
  ('speculative.tasks', 'speculative.data.tasks'),
  ('speculative.infer_settings', 'speculative.infer.settings'),
  ('speculative.train_data', 'speculative.train.data'),
  ('speculative.gin_utils', 'speculative.jobs.gin_utils'),
]


def test_at_most_twelve_modules_directly_under_the_package():
  modules = sorted(path.name for path in (REPO / 'speculative').glob('*.py'))
  assert len(modules) <= 12, modules


@pytest.mark.parametrize('old,new', MOVED)
def test_old_module_paths_import_the_moved_modules(old, new):
  module = importlib.import_module(old)
  assert module is importlib.import_module(new)
  assert module.__spec__.name == new  # the module keeps its own spec


def test_a_gin_file_importing_an_old_module_path_still_parses(tmp_path):
  run_file = tmp_path / 'old.gin'
  run_file.write_text(
    'from __gin__ import dynamic_registration\n'
    'from speculative import tasks as speculative_tasks\n'
    'INPUTS = @speculative_tasks.make_inputs\n'
  )
  gin.clear_config()
  try:
    gin.parse_config_file(str(run_file))
    reference = gin.query_parameter('%INPUTS')
    assert (
      reference.configurable.wrapped
      is importlib.import_module('speculative.data.tasks').make_inputs
    )
  finally:
    gin.clear_config()
