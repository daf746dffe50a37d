"""Tests of speculative/data/metrics.py: BLEU, ROUGE and the repetition-loop rate."""

from __future__ import annotations

import pytest

from speculative.data import metrics
from speculative.data import tasks


def test_bleu():
  sentences = ["Die Suchleiste kann zur schnellen Suche verwendet werden.", "Öffnet den Dialog."]
  assert metrics.bleu(sentences, sentences) == {"bleu": pytest.approx(100.0)}
  partial = metrics.bleu(sentences, ["Die Suchleiste kann verwendet werden.", "Öffnet den Dialog."])
  assert 0.0 < partial["bleu"] < 100.0
  # Two references per prediction: a prediction equal to either reference scores 100.
  assert metrics.bleu([[s, "x y z"] for s in sentences], sentences)["bleu"] == pytest.approx(100.0)
  with pytest.raises(ValueError, match="2 targets but 1 predictions"):
    metrics.bleu(sentences, sentences[:1])


def test_rouge():
  summaries = ["The cat sat on the mat . It was happy .", "Stocks fell sharply on Monday ."]
  assert metrics.rouge(summaries, summaries) == {
    "rouge1": pytest.approx(100.0),
    "rouge2": pytest.approx(100.0),
    "rougeLsum": pytest.approx(100.0),
  }
  disjoint = metrics.rouge(summaries, ["zebra quantum", "violin orbit"])
  assert disjoint == {"rouge1": 0.0, "rouge2": 0.0, "rougeLsum": 0.0}
  with pytest.raises(ValueError, match="no predictions"):
    metrics.rouge([], [])


def test_loop_detector_flags_repetition_loops_and_no_reference():
  assert metrics.is_looping("die Tabelle die Tabelle die Tabelle")
  assert metrics.is_looping("Klicken Sie Klicken Klicken Klicken Klicken")
  assert not metrics.is_looping("a b c a b c")  # two copies are text, three are a loop
  assert not metrics.is_looping("x x x")  # a single word needs four copies
  references = [de for _, de in tasks.load_split("test")]
  assert sum(map(metrics.is_looping, references)) == 0
  scores = metrics.translation_metrics(references[:50], references[:50])
  assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
  assert scores["loop_pct"] == 0.0


def test_task_metrics_score_each_task_and_name_what_they_cannot(monkeypatch):
  """Translation: BLEU and chrF; summarization: ROUGE, or where rouge-score is missing (the device
  image) a note instead of an error at the end of a device run."""
  refs, outs = ["the cat sat on the mat"], ["the cat sat on a mat"]
  assert {"bleu", "chrf"} <= set(metrics.task_metrics("translate", refs, outs))
  assert "rouge1" in metrics.task_metrics("summarize", refs, outs)
  monkeypatch.setitem(__import__("sys").modules, "rouge_score", None)  # import fails
  assert metrics.task_metrics("summarize", refs, outs)["rouge"].startswith("not computed here (")
