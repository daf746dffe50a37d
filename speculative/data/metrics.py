"""Metrics of a decoded job (t5.evaluation.metrics conventions): corpus BLEU and chrF (sacrebleu),
mean ROUGE (rouge-score), and the rate of predictions caught in a repetition loop.

Each metric takes (targets, predictions) and returns {name: score}, as seqio's `metric_fns` do.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence


def bleu(
  targets: Sequence[Any],
  predictions: Sequence[str],
  tokenize: str = "intl",
) -> dict[str, float]:
  """Corpus BLEU (sacrebleu, exp smoothing, case-sensitive) -> {'bleu': score in [0, 100]}.

  `targets` is one reference string per prediction, or one list of references per prediction (all
  lists of the same length).
  """
  import sacrebleu  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions):
    raise ValueError(f"bleu: {len(targets)} targets but {len(predictions)} predictions")
  if not predictions:
    raise ValueError("bleu: no predictions")
  if isinstance(targets[0], (list, tuple)):
    num_references = len(targets[0])
    if any(len(refs) != num_references for refs in targets):
      raise ValueError("bleu: every prediction needs the same number of references")
    references = [[refs[i] for refs in targets] for i in range(num_references)]
  else:
    references = [list(targets)]
  score = sacrebleu.corpus_bleu(
    list(predictions),
    references,
    smooth_method="exp",
    smooth_value=0.0,
    force=False,
    lowercase=False,
    tokenize=tokenize,
    use_effective_order=False,
  )
  return {"bleu": float(score.score)}


def chrf(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Corpus chrF (sacrebleu defaults: character 6-grams, beta 2) -> {'chrf': score in [0, 100]}."""
  import sacrebleu  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions) or not predictions:
    raise ValueError(f"chrf: {len(targets)} targets and {len(predictions)} predictions")
  return {"chrf": float(sacrebleu.corpus_chrf(list(predictions), [list(targets)]).score)}


def is_looping(text: str, max_ngram: int = 6, min_repeats: int = 3) -> bool:
  """True when some word n-gram (n <= max_ngram) occurs `min_repeats` times back to back (a single
  word: one more time), e.g. "die Tabelle die Tabelle die Tabelle": the repetition loop of an
  undertrained decoder. tests/data/test_metrics.py checks that the test split's references have
  none.
  """
  words = text.split()
  for n in range(1, max_ngram + 1):
    copies = min_repeats + (n == 1)
    # A span of `copies` repeats of period n gives n * (copies - 1) consecutive positions i with
    # words[i] == words[i - n].
    needed, run = n * (copies - 1), 0
    for i in range(n, len(words)):
      run = run + 1 if words[i] == words[i - n] else 0
      if run >= needed:
        return True
  return False


def loop_rate(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """Percent of predictions that fall into a repetition loop (`is_looping`)."""
  del targets
  return {"loop_pct": 100.0 * sum(map(is_looping, predictions)) / max(len(predictions), 1)}


def translation_metrics(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """BLEU, chrF and the repetition-loop rate: the quality figures of an En-De job."""
  return {
    **bleu(targets, predictions),
    **chrf(targets, predictions),
    **loop_rate(targets, predictions),
  }


def rouge(
  targets: Sequence[str],
  predictions: Sequence[str],
  score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
) -> dict[str, float]:
  """Mean ROUGE F-measure x 100 over examples (deterministic; t5's `rouge_mean`)."""
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

  if len(targets) != len(predictions):
    raise ValueError(f"rouge: {len(targets)} targets but {len(predictions)} predictions")
  if not predictions:
    raise ValueError("rouge: no predictions")
  scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys))
  # rougeLsum splits summaries on newlines: put one sentence per line, as t5 does.
  prepare = lambda text: text.replace(" . ", " .\n")
  totals = {key: 0.0 for key in score_keys}
  for target, prediction in zip(targets, predictions):
    scores = scorer.score(target=prepare(target), prediction=prepare(prediction))
    for key in score_keys:
      totals[key] += scores[key].fmeasure
  return {key: 100.0 * total / len(predictions) for key, total in totals.items()}


def summarization_metrics(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
  """ROUGE-1/2/Lsum and the repetition-loop rate: the quality figures of a summarization job."""
  return {**rouge(targets, predictions), **loop_rate(targets, predictions)}


def task_metrics(task: str, targets: Sequence[str], predictions: Sequence[str]) -> dict[str, Any]:
  """The quality figures of a 'translate' or 'summarize' task's outputs; where rouge-score is not
  installed (the device image), summaries get {'rouge': 'not computed here (...)'} instead."""
  if task == "translate":
    return translation_metrics(targets, predictions)
  try:
    return summarization_metrics(targets, predictions)
  except ImportError as e:
    return {"rouge": f"not computed here ({e})"}
