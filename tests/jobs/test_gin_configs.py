"""Every gin file of the T5X integration and of the paper's Table 2 experiments parses and binds.

  configs/local/experiments/*.gin, configs/runs/infer.gin   our runner (`python -m speculative.infer`)
  configs/t5x/**.gin                                          `python -m t5x.{infer,eval}` (needs t5x)

Each experiment file is checked against paper Table 2 (Leviathan et al. 2023): its bindings (draft
size, gamma, temperature, T5-XXL target, batch 1) and the alpha / speedup its header documents.

  python -m pytest -q -p no:xdist tests/jobs/test_gin_configs.py
"""

from __future__ import annotations

import inspect
from pathlib import Path
import re
import sys

import gin
import pytest

from speculative import infer as infer_lib
from speculative.data import tasks
from speculative.infer import inputs as infer_inputs
from speculative.infer import settings as infer_settings
from speculative.jobs import gin_utils
from speculative.t5x_adapter import options

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / 'configs'
XXL = options.T5_1_1_SIZES['xxl']

# Paper Table 2: (task, draft, temperature) -> (gamma, alpha, speedup). T5-XXL target, batch 1.
TABLE2 = {
  ('ende', 'small', 0): (7, 0.75, 3.4),
  ('ende', 'small', 1): (7, 0.62, 2.6),
  ('ende', 'base', 0): (7, 0.8, 2.8),
  ('ende', 'base', 1): (5, 0.68, 2.4),
  ('ende', 'large', 0): (7, 0.82, 1.7),
  ('ende', 'large', 1): (3, 0.71, 1.4),
  ('cnndm', 'small', 0): (5, 0.65, 3.1),
  ('cnndm', 'small', 1): (5, 0.53, 2.3),
  ('cnndm', 'base', 0): (5, 0.73, 3.0),
  ('cnndm', 'base', 1): (3, 0.55, 2.2),
  ('cnndm', 'large', 0): (3, 0.74, 2.2),
  ('cnndm', 'large', 1): (3, 0.56, 1.7),
}
TASK_NAMES = {'ende': 'speculative_wmt_t2t_ende_v003', 'cnndm': 'speculative_cnn_dailymail_v002'}
TASK_PREFIXES = {'ende': tasks.TRANSLATE_EN_DE_PREFIX, 'cnndm': tasks.SUMMARIZE_PREFIX}
ROWS = sorted(TABLE2)
ROW_IDS = [f'{task}_{draft}_t{t}' for task, draft, t in ROWS]
REQUIRED = ["CHECKPOINT_PATH = '/ckpt/target'", "DRAFT_CHECKPOINT_PATH = '/ckpt/draft'"]


def _shape(config) -> tuple[int, ...]:
  return (
    config.emb_dim,
    config.num_heads,
    config.num_encoder_layers,
    config.num_decoder_layers,
    config.head_dim,
    config.mlp_dim,
  )


def _value(reference):
  """Evaluates a queried gin parameter (macros and `@configurable()` references)."""
  if isinstance(reference, gin.config.ConfigurableReference):
    return reference.scoped_configurable_fn() if reference.evaluate else reference
  return reference


@pytest.fixture
def clean_gin():
  gin.clear_config()
  gin.add_config_file_search_path(str(REPO))
  yield
  gin.clear_config()


def _check_header(path: Path, gamma: int, alpha: float, speedup: float) -> None:
  text = path.read_text()
  assert f'gamma = {gamma}: alpha = {alpha}, walltime speedup = {speedup}X' in text, path
  assert f'--gin_file=configs/{path.relative_to(CONFIGS).as_posix()}' in text, path


# ----------------------------------------------------------------------------------------------
# Our runner: no t5x needed.
# ----------------------------------------------------------------------------------------------
# The local run files with an INPUT_FILE: the task's prefix unless INPUT_PREFIX = '' (issue 37).
RUN_FILE_PREFIXES = [
  ('configs/local/run.gin', tasks.TRANSLATE_EN_DE_PREFIX),
  ('configs/local/summarize.gin', tasks.SUMMARIZE_PREFIX),
]


@pytest.mark.parametrize('run_file,prefix', RUN_FILE_PREFIXES, ids=['run', 'summarize'])
def test_an_input_file_gets_the_run_files_task_prefix(run_file, prefix, clean_gin, tmp_path):
  (tmp_path / 'in.txt').write_text('Click OK.\n')
  gin_utils.register_configurables()
  gin.external_configurable(infer_lib.infer, 'infer')  # as `python -m speculative.infer` does
  file_input = [
    f"INPUT_FILE = '{tmp_path / 'in.txt'}'",
    'MIXTURE_OR_TASK_NAME = None',
    f"INFER_OUTPUT_DIR = '{tmp_path / 'out'}'",
  ]
  for extra, expected in (([], prefix), (["INPUT_PREFIX = ''"], '')):
    gin.clear_config()
    gin_utils.parse([run_file], file_input + extra)
    bound = {
      name: _value(gin.query_parameter(f'infer.{name}')) for name in gin.get_bindings('infer')
    }
    inputs = infer_inputs.load_inputs(infer_settings.InferSettings(**bound))
    assert inputs.examples[0].inputs == expected + 'Click OK.'
    assert inputs.source['input_prefix'] == expected  # recorded in the manifest


@pytest.mark.parametrize(
  'run_file', ['configs/local/run.gin', 'configs/local/summarize.gin', 'configs/runs/infer.gin']
)
def test_run_file_headers_document_the_input_prefix_and_the_vocabulary(run_file):
  header = '\n'.join(line for line in (REPO / run_file).read_text().splitlines() if line[:1] == '#')
  for name in ('INPUT_FILE', 'INPUT_PREFIX', 'infer.vocabulary_path'):
    assert name in header, name


@pytest.mark.parametrize('row', ROWS, ids=ROW_IDS)
def test_local_experiment_binds_paper_row(row, clean_gin):
  task, draft, temperature = row
  gamma, alpha, speedup = TABLE2[row]
  path = CONFIGS / 'local' / 'experiments' / f'{task}_{draft}_t{temperature}.gin'
  _check_header(path, gamma, alpha, speedup)
  gin_utils.register_configurables()
  gin.external_configurable(infer_lib.infer, 'infer')  # as `python -m speculative.infer` does
  gin.parse_config_files_and_bindings([str(path)], REQUIRED + ["INFER_OUTPUT_DIR = '/tmp/out'"])
  bound = {name: _value(gin.query_parameter(f'infer.{name}')) for name in gin.get_bindings('infer')}
  assert set(bound) <= set(inspect.signature(infer_lib.infer).parameters)
  assert bound['gamma'] == gamma
  assert bound['temperature'] == float(temperature)
  assert (bound['top_k'], bound['top_p']) == (0, 1.0)  # T=1 is exact sampling
  assert _shape(bound['target_config']) == XXL
  assert _shape(bound['draft_config']) == options.T5_1_1_SIZES[draft]
  assert bound['target_config'].vocab_size == bound['draft_config'].vocab_size == 32128
  assert bound['mixture_or_task_name'] == TASK_NAMES[task]
  assert bound['batch_size'] == 1 and bound['split'] == 'test'
  assert bound['modes'] == ('baseline', 'speculative')
  assert bound['target_checkpoint'] == '/ckpt/target'
  assert bound['draft_checkpoint'] == '/ckpt/draft'
  assert set(bound['task_feature_lengths']) == {'inputs', 'targets'}
  # An INPUT_FILE instead of the task gets the task's prefix; the draft and the path as run.gin's.
  assert bound['input_file'] is None
  assert bound['input_prefix'] == TASK_PREFIXES[task]
  assert (bound['drafter'], bound['kernels']) == ('model', 'auto')


def test_every_table2_row_has_exactly_one_file_per_runner():
  for runner in ('local', 't5x'):
    names = {
      p.stem
      for p in (CONFIGS / runner / 'experiments').glob('*_t[01].gin')
      if 'baseline' not in p.stem
    }
    assert names == set(ROW_IDS), runner


@pytest.mark.parametrize('row', ROWS, ids=ROW_IDS)
def test_t5x_experiment_file_text_matches_paper_row(row):
  """Checked without t5x: the macros and includes the T5X run depends on."""
  task, draft, temperature = row
  gamma, alpha, speedup = TABLE2[row]
  path = CONFIGS / 't5x' / 'experiments' / f'{task}_{draft}_t{temperature}.gin'
  _check_header(path, gamma, alpha, speedup)
  text = path.read_text()
  assert re.search(rf"^DRAFT_SIZE = '{draft}'$", text, re.M)
  assert re.search(rf'^GAMMA = {gamma}$', text, re.M)
  assert re.search(rf'^TEMPERATURE = {float(temperature)}$', text, re.M)
  for include in (
    't5x/examples/t5/t5_1_1/xxl.gin',
    'configs/t5x/infer.gin',
    f'configs/t5x/experiments/{task}_task.gin',
  ):
    assert f"include '{include}'" in text


# ----------------------------------------------------------------------------------------------
# T5X run files: need t5x.
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def t5x_gin(clean_gin, monkeypatch):
  """Gin as `python -m t5x.infer` / `t5x.eval` set it up (their functions live in __main__)."""
  pytest.importorskip('t5x', reason='t5x is not importable (not on PyPI; README, "Installing T5X")')
  import t5x
  from t5x import eval as t5x_eval
  from t5x import infer as t5x_infer

  main = sys.modules['__main__']
  monkeypatch.setattr(main, 'infer', t5x_infer.infer, raising=False)
  monkeypatch.setattr(
    main, 'write_inferences_to_file', t5x_infer.write_inferences_to_file, raising=False
  )
  monkeypatch.setattr(main, 'evaluate', t5x_eval.evaluate, raising=False)
  gin.add_config_file_search_path(str(Path(t5x.__file__).resolve().parents[1]))


def _t5x_parse(files, bindings=()):
  gin.parse_config_files_and_bindings(
    [str(f) for f in files],
    list(bindings) + REQUIRED + ["INFER_OUTPUT_DIR = '/tmp/o'", "EVAL_OUTPUT_DIR = '/tmp/e'"],
    finalize_config=False,
  )


@pytest.mark.parametrize('row', ROWS, ids=ROW_IDS)
def test_t5x_experiment_binds_paper_row(row, t5x_gin):
  task, draft, temperature = row
  gamma = TABLE2[row][0]
  _t5x_parse([CONFIGS / 't5x' / 'experiments' / f'{task}_{draft}_t{temperature}.gin'])
  model = _value(gin.query_parameter('%MODEL'))
  assert type(model).__name__ == 'SpeculativeEncoderDecoderModel'
  assert _shape(model.target.config) == XXL
  assert _shape(model.draft.config) == options.T5_1_1_SIZES[draft]
  assert model.target.config.dtype == model.draft.config.dtype == 'bfloat16'  # T5X's TPU dtype
  assert model.decode_defaults == {
    'gamma': gamma,
    'temperature': float(temperature),
    'topk': 0,
    'topp': 0.0,
  }
  assert _value(gin.query_parameter('%MIXTURE_OR_TASK_NAME')) == TASK_NAMES[task]
  assert gin.query_parameter('utils.DatasetConfig.batch_size') == 1
  assert gin.query_parameter('infer_script.infer.mode') == 'predict_with_aux'
  transforms = gin.query_parameter('utils.RestoreCheckpointConfig.state_transformation_fns')
  assert [t.selector for t in transforms] == ['t5x_adapter.add_draft_checkpoint']
  assert _value(gin.query_parameter('t5x_adapter.add_draft_checkpoint.path')) == '/ckpt/draft'
  assert _value(gin.query_parameter('utils.RestoreCheckpointConfig.path')) == '/ckpt/target'


@pytest.mark.parametrize('task', ['ende', 'cnndm'])
@pytest.mark.parametrize('temperature', [0, 1])
def test_t5x_baseline_binds_stock_model(task, temperature, t5x_gin):
  _t5x_parse([CONFIGS / 't5x' / 'experiments' / f'{task}_baseline_t{temperature}.gin'])
  model = _value(gin.query_parameter('%MODEL'))
  assert type(model).__name__ == 'EncoderDecoderModel'
  assert gin.query_parameter('decoding.temperature_sample.temperature') == float(temperature)
  assert gin.query_parameter('decoding.temperature_sample.topk') == 0
  assert _value(gin.query_parameter('%MIXTURE_OR_TASK_NAME')) == TASK_NAMES[task]


def test_t5x_eval_and_tiny_infer_bind(t5x_gin):
  _t5x_parse(
    ['t5x/examples/t5/t5_1_1/small.gin', CONFIGS / 't5x' / 'eval.gin'],
    [
      "DRAFT_SIZE = 'tiny'",
      'GAMMA = 3',
      "MIXTURE_OR_TASK_NAME = 'libreoffice_ende'",
      'DROPOUT_RATE = 0.0',
    ],
  )
  model = _value(gin.query_parameter('%MODEL'))
  assert _shape(model.target.config) == options.T5_1_1_SIZES['small']
  assert model.gamma == 3 and model.decode_defaults['temperature'] == 0.0
  assert gin.query_parameter('eval_script.evaluate.model').selector == 'gin.macro'

  gin.clear_config()
  _t5x_parse([CONFIGS / 't5x' / 'tiny_infer.gin'])
  model = _value(gin.query_parameter('%MODEL'))
  assert _shape(model.target.config) == _shape(model.draft.config) == options.T5_1_1_SIZES['tiny']
  assert model.target.config.dtype == 'float32'
  assert _value(gin.query_parameter('%MIXTURE_OR_TASK_NAME')) == 'libreoffice_ende_smoke'


# ----------------------------------------------------------------------------------------------
# Training runs (`python -m speculative.train`): no t5x needed.
# ----------------------------------------------------------------------------------------------
TRAIN_CONFIGS = sorted(p for p in (CONFIGS / 'train').glob('*.gin') if p.name != 'base.gin')


@pytest.mark.parametrize('path', TRAIN_CONFIGS, ids=[p.stem for p in TRAIN_CONFIGS])
def test_train_config_binds_train_arguments(path, clean_gin):
  """Each run file names its exact command and binds only `train` arguments, with a known optimizer
  and schedule and a model config of the shipped 8k vocabulary."""
  from speculative import train as train_lib
  from speculative.train import steps as train_steps

  assert f'--gin_file=configs/train/{path.name}' in path.read_text(), path
  gin_utils.register_configurables()
  gin.external_configurable(train_lib.train, 'train')  # as `python -m speculative.train` does
  gin.parse_config_file(str(path))
  bound = {name: _value(gin.query_parameter(f'train.{name}')) for name in gin.get_bindings('train')}
  assert set(bound) <= set(inspect.signature(train_lib.train).parameters), path
  assert bound.get('optimizer', 'adamw') in train_steps.OPTIMIZERS
  assert bound.get('schedule', 'cosine') in train_steps.SCHEDULES
  assert bound['model_config'].vocab_size == 8000
