"""Tests of the benchmark's own pages: the drafters page (speculative/bench/drafters_page.py) and
the SpecTr page (speculative/bench/spectr_page.py), run end to end on tiny random-init models, and
their Markdown from a saved report (the committed pages are their committed JSON rendered)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from speculative.bench import costs
from speculative.bench import drafters_page
from speculative.bench import methods as methods_lib
from speculative.bench import report as report_lib
from speculative.bench import spectr_page

TINY_GIN = """
TINY_TARGET = @tiny_target/t5.T5Config()
TINY_DRAFT = @tiny_draft/t5.T5Config()
tiny_target/t5.T5Config:
  vocab_size = 8000
  emb_dim = 16
  num_heads = 2
  num_encoder_layers = 1
  num_decoder_layers = 2
  head_dim = 8
  mlp_dim = 32
tiny_draft/t5.T5Config:
  vocab_size = 8000
  emb_dim = 8
  num_heads = 2
  num_encoder_layers = 1
  num_decoder_layers = 1
  head_dim = 4
  mlp_dim = 16
"""


def _tiny_pair_args(tmp_path) -> list[str]:
  """Options naming a tiny random-init pair (checkpoints that do not exist) and an output dir."""
  gin_file = tmp_path / 'tiny.gin'
  gin_file.write_text(TINY_GIN)
  args = ['--allow_random_init', '--output_dir', str(tmp_path / 'out')]
  for role in ('target', 'draft'):
    args += [f'--{role}_gin', str(gin_file), f'--{role}_macro', f'TINY_{role.upper()}']
    args += [f'--{role}_checkpoint', str(tmp_path / f'missing_{role}.msgpack')]
  return args


def test_pages_share_the_pair_options(capsys):
  drafters_args = drafters_page.parse_args(['--quick'])
  spectr_args = spectr_page.parse_args(['--quick'])
  for args in (drafters_args, spectr_args):
    assert args.target_gin == 'configs/models/embedded_target.gin'
    assert args.draft_checkpoint == 'models/embedded/draft.msgpack'
  assert (drafters_args.num_examples, drafters_args.repeats, drafters_args.gammas) == (8, 1, '2,4')
  assert (spectr_args.ks, spectr_args.ls, spectr_args.allow_random_init) == ([1, 2], [4], True)
  assert spectr_args.output_dir == 'outputs/bench_spectr_quick'
  # Under --quick an option given on the command line wins over the smoke run's preset.
  given = drafters_page.parse_args(['--gammas', '3', '--quick', '--max_new_tokens', '40'])
  assert (given.gammas, given.max_new_tokens, given.num_examples) == ('3', 40, 8)
  given = spectr_page.parse_args(['--quick', '--ls', '8', '--output_dir', 'elsewhere'])
  assert (given.ls, given.ks, given.output_dir) == ([8], [1, 2], 'elsewhere')
  # argparse refuses with exit code 2 and names the problem on stderr.
  with pytest.raises(SystemExit, match='^2$'):
    spectr_page.parse_args(['--ks', '2', '4'])  # K=1 is the reference
  assert 'error: --ks must include 1 (the K=1 reference)' in capsys.readouterr().err
  with pytest.raises(SystemExit, match='^2$'):
    drafters_page.parse_args(['--skip', 'alpha,tables'])
  assert "error: --skip: unknown parts ['tables']" in capsys.readouterr().err
  # Counts below 1 and lists that do not parse: refused before any model loads.
  for parse, argv, message in [
    (drafters_page.parse_args, ['--quick', '--gamma=0'], '--gamma must be >= 1, got 0'),
    (drafters_page.parse_args, ['--repeats=-1'], '--repeats must be >= 1, got -1'),
    (
      drafters_page.parse_args,
      ['--lenience=abc'],
      "--lenience must be a comma-separated list of float, got 'abc'",
    ),
    (drafters_page.parse_args, ['--lenience=0,1'], "--lenience values must be in (0, 1]"),
    (drafters_page.parse_args, ['--gammas=2,0'], "--gammas must be integers >= 1, got '2,0'"),
    (spectr_page.parse_args, ['--ks', '1', '0'], '--ks must be >= 1, got [1, 0]'),
    (spectr_page.parse_args, ['--ls', '0'], '--ls must be >= 1, got [0]'),
  ]:
    with pytest.raises(SystemExit, match='^2$'):
      parse(argv)
    assert f'error: {message}' in capsys.readouterr().err


def test_a_missing_checkpoint_is_an_error_without_allow_random_init(tmp_path):
  args = [a for a in _tiny_pair_args(tmp_path) if a != '--allow_random_init']
  with pytest.raises(
    FileNotFoundError, match='^target checkpoint does not exist: .*missing_target'
  ):
    methods_lib.load_pair(drafters_page.parse_args(args))


DOCS = Path(__file__).resolve().parents[2] / 'docs'


def test_the_committed_pages_are_their_json_rendered():
  drafters = json.loads((DOCS / 'drafters' / 'drafters.json').read_text())
  assert drafters_page.markdown(drafters) == (DOCS / 'drafters' / 'drafters.md').read_text()
  spectr = json.loads((DOCS / 'spectr' / 'results.json').read_text())
  assert spectr_page.format_report(spectr) == (DOCS / 'spectr' / 'results.md').read_text()
  # A refused SpecTr prediction reads as in every other table; a method without one reads '-'.
  refused = copy.deepcopy(spectr)
  row = next(r for r in refused['rows'] if r.get('predicted_speedup') is not None)
  row.update(predicted_speedup=None, too_noisy='v(2x5) spread 0.40 > 0.25')
  cells = {
    line.split(' | ')[0].lstrip('| '): line.rstrip(' |').rsplit(' | ', 1)[1]
    for line in spectr_page.format_report(refused).splitlines()
    if line.startswith(('| baseline', f'| {row["method"]} |'))
  }
  assert cells == {'baseline': '-', row['method']: costs.TOO_NOISY}


def test_the_results_page_names_the_pages_modules():
  titles = dict(report_lib.RELATED_PAGES)
  assert 'speculative.bench.spectr_page' in titles['spectr/results.md']
  assert 'speculative.bench.drafters_page' in titles['drafters/drafters.md']


@pytest.mark.slow
def test_drafters_page_quick_run_writes_its_tables(tmp_path):
  argv = ['--quick', '--drafters', 'model,prompt_lookup', '--lenience', '1,0.5']
  argv += ['--stop_below', '0.5', '--gammas', '2'] + _tiny_pair_args(tmp_path)
  report = drafters_page.main(argv)
  out = tmp_path / 'out'
  saved = json.loads((out / 'drafters.json').read_text())
  assert saved['setup']['command'].startswith('python -m speculative.bench.drafters_page --quick')
  assert [(r['drafter'], r['temperature']) for r in saved['alpha']] == [
    ('model', 0.0),
    ('model', 1.0),
    ('prompt_lookup', 0.0),
    ('prompt_lookup', 1.0),
  ]
  for row in saved['alpha']:
    assert 0.0 <= row['alpha'] <= 1.0 and row['tokens_per_call'] >= 1.0
  assert [r['lenience'] for r in saved['lenience']['0.0']] == [1.0, 0.5]
  methods = [r['method'] for r in saved['walltime']['rows']]
  assert methods[0] == 'baseline' and 'fixed gamma=2' in methods
  assert methods[-1] == 'acceptance rule, max gamma=4, adaptive verify'
  assert saved['walltime']['rows'][0]['speedup'] == pytest.approx(1.0)
  text = (out / 'drafters.md').read_text()
  assert text == drafters_page.markdown(report)
  assert '### Alpha per drafter' in text and '### Walltime: adaptive vs fixed gamma' in text


@pytest.mark.slow
def test_spectr_page_quick_run_matches_speculative_at_one_draft(tmp_path):
  report = spectr_page.main(['--quick'] + _tiny_pair_args(tmp_path))
  out = tmp_path / 'out'
  saved = json.loads((out / 'results.json').read_text())
  assert saved['command'].startswith('python -m speculative.bench.spectr_page --quick')
  rows = {r['method']: r for r in saved['rows']}
  assert list(rows) == ['baseline', 'speculative L=4', 'spectr K=1 L=4', 'spectr K=2 L=4']
  assert rows['spectr K=1 L=4']['identical_to_speculative'] is True
  assert rows['spectr K=1 L=4']['generated_tokens'] == rows['speculative L=4']['generated_tokens']
  assert rows['spectr K=2 L=4']['spectr_table4'] is None and 'v' in rows['spectr K=2 L=4']
  assert set(saved['costs']['c']) == {'1', '2'}
  text = (out / 'results.md').read_text()
  assert text == spectr_page.format_report(report)
  assert 'L=4: yes' in text


def test_a_missing_checkpoint_on_the_command_line_is_one_line(tmp_path, capsys):
  argv = ['--target_checkpoint', str(tmp_path / 'missing.msgpack'), '--output_dir', str(tmp_path)]
  with pytest.raises(SystemExit, match="^2$") as exit_info:
    methods_lib.command_line(drafters_page.main, argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: target checkpoint does not exist') and len(err.splitlines()) == 1
  with pytest.raises(
    FileNotFoundError, match='^target checkpoint does not exist: .*missing.msgpack'
  ):
    methods_lib.command_line(drafters_page.main, argv + ['--debug'])
  assert not list(tmp_path.iterdir())  # nothing written
