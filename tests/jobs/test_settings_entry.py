"""`checks.settings_entry`: a runner whose keyword arguments are its settings dataclass's fields,
bound by gin by name, checked as user errors before the run; and the three runners made with it."""

import dataclasses
import inspect

import gin
import pytest

from speculative import infer
from speculative import train
from speculative.bench import main as bench_main
from speculative.infer import settings as infer_settings
from speculative.jobs import checks
from speculative.train import settings as train_settings


@dataclasses.dataclass(frozen=True)
class _Settings:
  name: str
  size: int = 2
  tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)

  def __post_init__(self):
    checks.check_int('size', self.size, 1)


@checks.settings_entry(_Settings)
def _runner(settings: _Settings) -> str:
  """Doc of the runner."""
  return f'{settings.name} x{settings.size} {settings.tags}'


def test_the_entry_takes_the_fields_and_runs_on_the_settings():
  assert _runner(name='a') == 'a x2 ()'
  assert _runner(name='a', size=3, tags=('t',)) == "a x3 ('t',)"
  with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
    _runner(name='a', colour='red')  # not a field
  assert _runner.__doc__ == 'Doc of the runner.' and _runner.__name__ == '_runner'


def test_a_bad_field_is_a_user_error_before_the_run():
  with pytest.raises(ValueError, match='size') as error:
    _runner(name='a', size=0)
  assert checks.user_message(error.value) == str(error.value)


def test_gin_binds_the_fields_by_name_and_refuses_others():
  gin.clear_config()
  try:
    configurable = gin.external_configurable(_runner, 'settings_entry_test_runner')
    gin.parse_config(
      ["settings_entry_test_runner.name = 'g'", 'settings_entry_test_runner.size = 5']
    )
    assert configurable() == 'g x5 ()'
    with pytest.raises(ValueError, match="doesn't have a parameter named 'colour'"):
      gin.parse_config('settings_entry_test_runner.colour = 1')
  finally:
    gin.clear_config()


@pytest.mark.parametrize(
  'runner,settings_type',
  [
    (infer.infer, infer_settings.InferSettings),
    (train.train, train_settings.TrainSettings),
    (bench_main.benchmark, bench_main.BenchmarkSettings),
  ],
)
def test_the_runners_signatures_are_their_settings_fields(runner, settings_type):
  parameters = inspect.signature(runner).parameters
  fields = dataclasses.fields(settings_type)
  assert list(parameters) == [f.name for f in fields]
  assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
  for field in fields:
    if field.default is not dataclasses.MISSING:
      assert parameters[field.name].default == field.default, field.name
