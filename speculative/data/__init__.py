"""Data: the LibreOffice En-De corpus, the seqio tasks and the metrics.

html      the help pages' paragraphs, read from their HTML and aligned across two languages
corpus    the corpus pairs: cleaning, the deterministic split, TSV (.tsv.gz) reading and writing
tasks     the seqio tasks (`register_tasks`), the vocabulary and the corpus splits
vocabulary  the jobs' SentencePiece vocabulary, seqio's ids and text without TensorFlow
metrics   BLEU, chrF, ROUGE and the repetition-loop rate of a decoded job
overlap   train/test overlap checks of a corpus
summ_corpus  the Debian package descriptions summarization corpus (long description -> synopsis)
summ_baselines  its two ROUGE references: the first sentence, TF-IDF retrieval
"""
