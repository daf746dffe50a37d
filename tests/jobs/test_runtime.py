import pytest

"""The CPU runtime defaults: the user's XLA_FLAGS win, and the defaults keep the tokens exact."""

import json
import os
from pathlib import Path
import subprocess
import sys

from speculative.jobs import runtime

REPO = Path(__file__).resolve().parents[2]

# A tiny random target decoded greedily and speculatively (its own copy as the draft); prints the
# tokens as JSON. Runs in a fresh process because XLA reads XLA_FLAGS once, at backend start.
_DECODE = """
import json, sys
sys.path.insert(0, {repo!r})
from speculative.jobs import runtime
runtime.apply_cpu_defaults()
import jax, jax.numpy as jnp
from speculative import drafters, sampling
from speculative.decode import loops as decoding
from speculative.models.t5 import T5, T5Config
sys.path.insert(0, {tests!r})
from model_utils import random_params
config = T5Config(vocab_size=64, emb_dim=32, num_heads=2, num_encoder_layers=2,
                  num_decoder_layers=2, head_dim=16, mlp_dim=64)
model = T5(config)
params = random_params(model, 0, logit_scale=4.0)
enc = jnp.asarray([[5, 9, 12, 3, 1, 0], [7, 7, 2, 1, 0, 0]], jnp.int32)
cfg, sp = sampling.make_sampling(0.0)
base = decoding.autoregressive_decode(model, params, None, max_new_tokens=12, sampling=cfg,
                                      sampling_params=sp, eos_id=1, encoder_tokens=enc)
spec = decoding.speculative_decode(model, params, drafters.ModelDrafter(model), params, None,
                                   None, gamma=3, max_new_tokens=12, sampling=cfg,
                                   sampling_params=sp, eos_id=1, encoder_tokens=enc)
print(json.dumps([base.tokens.tolist(), spec.tokens.tolist(), runtime.settings_in_force()]))
"""


def _decode(env_flags):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  if env_flags is not None:
    env['XLA_FLAGS'] = env_flags
  code = _DECODE.format(repo=str(REPO), tests=str(REPO / 'tests'))
  out = subprocess.run(
    [sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True, timeout=900
  )
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_user_flags_are_kept():
  environ = {'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true'}
  assert runtime.apply_cpu_defaults(environ) == '--xla_cpu_multi_thread_eigen=true'
  assert environ == {'XLA_FLAGS': '--xla_cpu_multi_thread_eigen=true'}


def test_defaults_applied_when_unset():
  environ = {}
  flags = runtime.apply_cpu_defaults(environ)
  assert flags == ' '.join(runtime.DEFAULT_CPU_XLA_FLAGS)
  assert environ.get('XLA_FLAGS', '') == flags


@pytest.mark.slow
def test_user_flags_reach_xla_and_tokens_stay_exact():
  # A user's XLA_FLAGS reach XLA unchanged (here: two host devices instead of one) and the decode
  # reports them as the user's; under our defaults and under the user's flags the greedy tokens
  # are the same, baseline and speculative.
  base_default, spec_default, default = _decode(None)
  base_user, spec_user, user = _decode('--xla_force_host_platform_device_count=2')
  assert default['xla_flags'] == ' '.join(runtime.DEFAULT_CPU_XLA_FLAGS)
  assert default['xla_flags_source'] == 'default' and default['devices'] == 1
  assert user['xla_flags_source'] == 'user' and user['devices'] == 2
  assert base_default == spec_default  # greedy speculative == baseline
  assert base_user == spec_user and base_user == base_default
  assert default['param_dtype_in_memory'] == 'float32'


def test_the_machine_record_names_the_cpu_its_features_and_l3(tmp_path):
  size = tmp_path / 'size'
  for text, mib in (('32768K\n', 32.0), ('260M', 260.0), ('1G', 1024.0), ('', None), ('12X', None)):
    size.write_text(text)
    assert runtime.l3_cache_mib(str(size)) == mib, text
  assert runtime.l3_cache_mib(str(tmp_path / 'missing')) is None
  machine = runtime.machine()
  assert set(machine['cpu_features']) <= set(runtime.CPU_FEATURES) and machine['usable_cores'] >= 1
  assert (machine['accelerator'] is None) == (machine['backend'] == 'cpu')  # any device's tests
  record = dict(cpu='AMD EPYC', cpu_features=['avx2', 'avx512f'], l3_cache_mib=32.0)
  assert runtime.cpu_line(record) == 'AMD EPYC (avx2 avx512f, L3 32 MiB)'
  assert runtime.cpu_line(dict(record, l3_cache_mib=None)) == 'AMD EPYC (avx2 avx512f)'
  assert runtime.cpu_line({'cpu': 'AMD EPYC'}) == 'AMD EPYC'  # a record made before they existed
