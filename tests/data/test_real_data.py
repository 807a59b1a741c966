"""The readers on the real corpora in ../shared/data (skipped when it is absent)."""

from __future__ import annotations

import pytest

from sanlab.data.conllu_io import read_conllu
from sanlab.data.parallel import read_parallel

pytestmark = pytest.mark.slow  # parses the full corpora (several seconds): not in the inner loop

UPOS = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X"}


@pytest.mark.parametrize(("split", "n_pairs"), [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)])
def test_multi30k_en_de(shared_file, split, n_pairs):
    pairs = read_parallel(shared_file(f"multi30k/{split}.en.gz"), shared_file(f"multi30k/{split}.de.gz"))
    assert len(pairs) == n_pairs
    assert all(src.strip() == src and tgt.strip() == tgt for src, tgt in pairs[:100])
    if split == "train":
        assert pairs[0][0].startswith("Two young, White males are outside")


@pytest.mark.parametrize(("split", "n_sentences"), [("train", 12544), ("dev", 2001), ("test", 2077)])
def test_ud_english_ewt(shared_file, split, n_sentences):
    sentences = read_conllu(shared_file(f"ud/UD_English-EWT/en_ewt-ud-{split}.conllu.gz"))
    assert len(sentences) == n_sentences
    assert {t for s in sentences for t in s.tags} <= UPOS
    words = [w for s in sentences for w in s.words]
    # Multiword tokens ("don't" = do + n't) contribute their parts, never the surface form.
    assert "don't" not in words and "n't" in words
    assert any(a.lower() == "do" and b == "n't" for s in sentences for a, b in zip(s.words, s.words[1:]))


def test_ud_other_treebanks_read(shared_file):
    for name, stem in [("UD_English-LinES", "en_lines"), ("UD_Afrikaans-AfriBooms", "af_afribooms"),
                       ("UD_Vietnamese-VTB", "vi_vtb")]:
        sentences = read_conllu(shared_file(f"ud/{name}/{stem}-ud-dev.conllu.gz"))
        assert sentences and {t for s in sentences for t in s.tags} <= UPOS
