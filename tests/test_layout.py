"""The package layout's promises (docs/design.md, section 1): a few modules beside the packages,
and the flat module paths of earlier versions still importing, from Python and from a gin file."""

import ast
import importlib
from pathlib import Path
import subprocess
import sys

import gin
import pytest

REPO = Path(__file__).resolve().parents[1]

MOVED = [
  ('speculative.decoding', 'speculative.decode.loops'),
  ('speculative.spectr_decoding', 'speculative.decode.spectr_loop'),
  ('speculative.spectr.decoding', 'speculative.decode.spectr_loop'),
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


MAX_MODULE_LINES = 650


def test_no_module_of_the_package_or_scripts_is_over_650_lines():
  long = {}
  for path in [*(REPO / 'speculative').rglob('*.py'), *(REPO / 'scripts').glob('*.py')]:
    lines = len(path.read_text(encoding='utf-8').splitlines())
    if lines > MAX_MODULE_LINES:
      long[str(path.relative_to(REPO))] = lines
  assert not long, long


def test_test_folders_mirror_the_packages():
  folders = {p.name for p in (REPO / 'tests').iterdir() if p.is_dir() and p.name != 'fixtures'}
  folders.discard('__pycache__')
  packages = {p.parent.name for p in (REPO / 'speculative').glob('*/__init__.py')}
  assert folders <= packages, folders - packages


def test_tests_import_nothing_from_scripts():
  """No import of a module there, and no sys.path entry or file-location import pointing there."""
  outside = {p.stem for p in (REPO / 'scripts').rglob('*.py')}
  offenders = []
  for path in (REPO / 'tests').rglob('*.py'):
    source = path.read_text(encoding='utf-8')
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [node.module or '']
      elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
        ('sys.path.insert', 'sys.path.append', 'spec_from_file_location')
      ):
        text = ast.unparse(node)
        names = ['scripts'] if 'scripts' in text else []
      else:
        continue
      for name in names:
        top = name.split('.')[0]
        if top == 'scripts' or top in outside:
          offenders.append(f'{path.relative_to(REPO)}:{node.lineno} {name}')
  assert not offenders, offenders


def test_the_packages_import_graph_has_no_cycle():
  result = subprocess.run(
    [sys.executable, str(REPO / 'scripts' / 'import_graph.py')],
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.rstrip().endswith(', 0 cycles')


def test_the_documented_commands_list_matches_the_docs():
  """scripts/check_documented_commands.py's list: each command's documented text is still in its
  document, and every command of README's first-hour section is in the list (the runs themselves
  take ~30 minutes: the pre-release check, docs/batch_jobs.md "Before a release")."""
  result = subprocess.run(
    [sys.executable, str(REPO / 'scripts' / 'check_documented_commands.py'), '--docs_only'],
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.rstrip().endswith('0 document problem(s)')


def test_a_first_hour_command_missing_from_the_list_is_found(tmp_path):
  heading = '## From a fresh clone: the first hour\n'
  docs = ['README.md', *(str(p.relative_to(REPO)) for p in sorted((REPO / 'docs').glob('*.md')))]
  for doc in docs:  # every document a listed command may be in
    text = (REPO / doc).read_text(encoding='utf-8')
    if doc == 'README.md':
      text = text.replace(heading, heading + '\n`.venv/bin/speculative-train --new`\n', 1)
    (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / doc).write_text(text, encoding='utf-8')
  result = subprocess.run(
    [sys.executable, str(REPO / 'scripts' / 'check_documented_commands.py'), '--docs_only']
    + ['--root', str(tmp_path)],
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 1, result.stdout + result.stderr
  assert result.stdout.splitlines()[0] == (
    "FAIL docs: README first-hour command not in the list: '.venv/bin/speculative-train --new'"
  )
