"""speculative: exact speculative decoding (Leviathan et al. 2023) and SpecTr in JAX/Flax.

The packages (docs/design.md, section 1):
  decode       the decode loops, their state and inputs, the modes of a job, batching, the audit
  spectr       SpecTr: k-Seq, the sequence-level selection, OTM-k, and its decode loop
  drafters     the drafters (a draft model, n-gram tables, prompt lookup) and their registry
  models       the T5 (T5X parameter tree) and a decoder-only LM behind one cached-LM interface
  checkpoints  weights on disk: T5X checkpoint directories, compact params files, their metadata
  data         the corpus, the seqio tasks and the metrics
  infer        the batch inference job (python -m speculative.infer)
  train        training (python -m speculative.train)
  bench        the walltime benchmark (python -m speculative.benchmark)
  jobs         what every job runs on: checks, the output lock and manifest, runtime, gin
  t5x_adapter  speculative decoding inside stock T5X (gin)
and two modules: `sampling` (the sampling distributions and the acceptance rule) and `analysis`
(the theory: expected tokens per step, the walltime model).

Modules that moved into the packages keep their old import paths (`speculative.decoding`,
`from speculative import tasks` in a gin file, ...): `_MOVED` maps each old name to the module
that now holds it, and importing the old name returns that module.
"""

import importlib
import importlib.abc
import importlib.util
import sys

# Old module path -> the module that now holds its code.
_MOVED = {
  'speculative.decoding': 'speculative.decode.loops',
  'speculative.decoding_state': 'speculative.decode.state',
  'speculative.decoding_inputs': 'speculative.decode.inputs',
  'speculative.modes': 'speculative.decode.modes',
  'speculative.batching': 'speculative.decode.batching',
  'speculative.audit': 'speculative.decode.audit',
  'speculative.spectr_kseq': 'speculative.spectr.kseq',
  'speculative.spectr_sequence': 'speculative.spectr.sequence',
  'speculative.spectr_otm': 'speculative.spectr.otm',
  'speculative.spectr_decoding': 'speculative.decode.spectr_loop',
  'speculative.spectr.decoding': 'speculative.decode.spectr_loop',
  'speculative.weights_format': 'speculative.checkpoints.weights_format',
  'speculative.t5x_checkpoints': 'speculative.checkpoints.t5x_format',
  'speculative.params_files': 'speculative.checkpoints.params_files',
  'speculative.files': 'speculative.checkpoints.files',
  'speculative.corpus': 'speculative.data.corpus',
  'speculative.tasks': 'speculative.data.tasks',
  'speculative.overlap': 'speculative.data.overlap',
  'speculative.infer_settings': 'speculative.infer.settings',
  'speculative.infer_inputs': 'speculative.infer.inputs',
  'speculative.infer_outputs': 'speculative.infer.outputs',
  'speculative.infer_report': 'speculative.infer.report',
  'speculative.train_data': 'speculative.train.data',
  'speculative.train_checkpoints': 'speculative.train.checkpoints',
  'speculative.runtime': 'speculative.jobs.runtime',
  'speculative.gin_utils': 'speculative.jobs.gin_utils',
  'speculative.resources': 'speculative.jobs.resources',
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds an old module path of `_MOVED` and loads it as the module that now holds it."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname not in _MOVED:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def __init__(self):
    self._specs = {}

  def create_module(self, spec):
    module = importlib.import_module(_MOVED[spec.name])
    self._specs[module.__name__] = module.__spec__
    return module

  def exec_module(self, module):
    # The import system set the old name's spec on the module; give it back its own.
    module.__spec__ = self._specs[module.__name__]


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
  sys.meta_path.append(_MovedModules())
