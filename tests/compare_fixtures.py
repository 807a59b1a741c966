"""What the ``sanlab compare`` test modules share: a small tagging recipe for hand-written grids to build on,
and a writer that returns the path it wrote (grids name their recipe by path)."""

from __future__ import annotations

from pathlib import Path

TAGGER = """\
task: tagging
data: {train: t.conllu, dev: d.conllu}
model: {word_dim: 8, char_dim: 4, char_filters: 4, char_layers: 1, encoder: {layers: 1}}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
