"""Models built from layers: the translation Seq2Seq and the sequence tagger."""
