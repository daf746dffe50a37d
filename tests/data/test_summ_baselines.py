"""The two ROUGE references of the summarization corpus (speculative/data/summ_baselines.py): the
first sentence and TF-IDF retrieval, their exact outputs on a tiny corpus and the command line."""

import gzip

import pytest

from speculative.data import metrics
from speculative.data import summ_baselines

TRAIN = [
  ("A library for reading PNG images. It is fast.", "PNG image library"),
  ("Fonts for the Latin script in four weights.", "Latin fonts"),
  ("A game of solitaire with penguins. Play cards.", "penguin solitaire"),
  ("Another library for reading JPEG images.", "JPEG image library"),
]
TEST = [
  ("Reads PNG images quickly. Version 1.2 adds more.", "fast PNG reader"),
  ("Penguins play solitaire, e.g. Klondike. Cards!", "solitaire games"),
  ("Zzz qqq unknown words", "nothing"),
]


def test_first_sentence():
  assert [summ_baselines.first_sentence(d) for d, _ in TEST] == [
    "Reads PNG images quickly.",
    "Penguins play solitaire, e.g. Klondike.",
    "Zzz qqq unknown words",
  ]
  assert summ_baselines.first_sentence("By David A. Wheeler. Then more.") == (
    "By David A. Wheeler."
  )


def test_retrieval_picks_the_most_similar_training_input():
  retriever = summ_baselines.Retriever(TRAIN)
  # 'png', 'images' -> the PNG library; 'penguins', 'play', 'solitaire', 'cards' -> the game;
  # no known word: every similarity is 0, ties go to the earliest training pair.
  assert retriever.nearest([d for d, _ in TEST]).tolist() == [0, 2, 0]
  assert summ_baselines.predictions("retrieval", [d for d, _ in TEST], TRAIN) == [
    "PNG image library",
    "penguin solitaire",
    "PNG image library",
  ]
  with pytest.raises(ValueError, match="unknown baseline 'oracle'"):
    summ_baselines.predictions("oracle", [], TRAIN)


def test_scores_are_the_jobs_rouge_of_those_outputs():
  scores = summ_baselines.score(TRAIN, TEST)
  references = [s for _, s in TEST]
  assert scores["lead"] == metrics.rouge(
    references,
    [
      "Reads PNG images quickly.",
      "Penguins play solitaire, e.g. Klondike.",
      "Zzz qqq unknown words",
    ],
  )
  assert scores["retrieval"] == metrics.rouge(
    references, ["PNG image library", "penguin solitaire", "PNG image library"]
  )
  assert set(scores["lead"]) == {"rouge1", "rouge2", "rougeLsum"}


def _write(path, pairs):
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.writelines(f"{d}\t{s}\n" for d, s in pairs)


def test_command_prints_the_table_and_refuses_a_malformed_line(tmp_path, capsys):
  _write(tmp_path / "train.tsv.gz", TRAIN)
  _write(tmp_path / "test.tsv.gz", TEST)
  summ_baselines.main(["--data_dir", str(tmp_path), "--num_examples", "2"])
  out = capsys.readouterr().out
  assert "| reference (2 documents) | ROUGE-1 | ROUGE-2 | ROUGE-Lsum |" in out
  assert "| lead |" in out and "| retrieval |" in out and "load average" in out
  with gzip.open(tmp_path / "test.tsv.gz", "wt", encoding="utf-8") as f:
    f.write("a description\ta synopsis\nno tab here\n")
  with pytest.raises(SystemExit, match="^2$") as exit_info:
    summ_baselines.main(["--data_dir", str(tmp_path)])
  assert exit_info.value.code == 2
  assert "test.tsv.gz:2: expected 2 tab-separated fields" in capsys.readouterr().err
