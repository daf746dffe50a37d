"""Registers the project's seqio tasks when imported, for T5X gin files (`import ...tasks`).

T5X gin files register tasks by importing a module; `speculative.data.tasks.register_tasks()` is a
function, so this module calls it on import (idempotent) and adds one more task:

  libreoffice_ende                  the shipped LibreOffice help En-De corpus (spm8k vocabulary)
  debian_summarize                  Debian package descriptions -> synopsis (spm8k vocabulary)
  speculative_wmt_t2t_ende_v003     the paper's WMT En-De task (TFDS), T5 vocabulary
  speculative_cnn_dailymail_v002    the paper's CNN/DM task (TFDS), T5 vocabulary
  libreoffice_ende_smoke            the first `SMOKE_EXAMPLES` examples of each libreoffice_ende split,
                                    for quick end-to-end checks of a T5X run (configs/t5x/tiny_infer.gin)
"""

from __future__ import annotations

import seqio

from speculative.data import metrics
from speculative.data import tasks as tasks_lib

SMOKE_TASK = 'libreoffice_ende_smoke'
SMOKE_EXAMPLES = 8


def _take_smoke_examples(dataset):
  return dataset.take(SMOKE_EXAMPLES)


def register() -> list[str]:
  """Registers the four project tasks and the smoke task (replacing earlier registrations)."""
  names = tasks_lib.register_tasks()
  if SMOKE_TASK in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(SMOKE_TASK)
  vocabulary = tasks_lib.get_vocabulary()
  seqio.TaskRegistry.add(
    SMOKE_TASK,
    source=tasks_lib.libreoffice_source(),
    preprocessors=(
      [_take_smoke_examples]
      + tasks_lib.libreoffice_text_preprocessors()
      + tasks_lib.tokenization_preprocessors()
    ),
    output_features=tasks_lib.output_features(vocabulary),
    postprocess_fn=tasks_lib.postprocess_text,
    metric_fns=[metrics.bleu],
  )
  return names + [SMOKE_TASK]


TASK_NAMES = register()
