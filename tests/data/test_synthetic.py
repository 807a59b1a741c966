"""Generated corpora: deterministic, the target a function of the source, reordering present,
CoNLL-U output readable by read_conllu."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest

from sanlab.data import synthetic
from sanlab.data.conllu_io import read_conllu, write_conllu
from sanlab.data.parallel import read_parallel
from sanlab.data.synthetic import generate_tagging, generate_translation, write_tagging_corpus, write_translation_corpus

PAIRS = generate_translation(3000, seed=11)
TARGET_VERBS = {form.split()[-1] for table in (synthetic._TRANSITIVE, synthetic._INTRANSITIVE)
                for forms in table.values() for form in forms[2:]}
SOURCE_VERBS = {w for table in (synthetic._TRANSITIVE, synthetic._INTRANSITIVE)
                for base, forms in table.items() for w in (base, forms[0], forms[1])}
UPOS = {"ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X"}


def clauses(sentence: str, conjunctions: set[str]) -> list[list[str]]:
    out, current = [], []
    for word in sentence.split():
        if word in conjunctions or word == ".":
            out.append(current)
            current = []
        else:
            current.append(word)
    return out


def test_translation_is_deterministic_given_seed():
    assert generate_translation(50, seed=11) == PAIRS[:50]
    assert generate_translation(50, seed=12) != PAIRS[:50]


def test_target_is_a_function_of_the_source():
    targets: dict[str, set[str]] = defaultdict(set)
    for src, tgt in PAIRS + generate_translation(3000, seed=12):
        targets[src].add(tgt)
    assert all(len(t) == 1 for t in targets.values())
    assert sum(len(t) for t in targets.values()) > 5000  # mostly distinct sentences


def test_vocabulary_and_length():
    vocab = Counter(w for src, _ in PAIRS for w in src.split())
    assert 60 <= len(vocab) <= 120
    lengths = [len(src.split()) for src, _ in PAIRS]
    assert min(lengths) >= 4 and max(lengths) == synthetic.MAX_SOURCE_TOKENS
    assert all(src.endswith(" .") and tgt.endswith(" .") for src, tgt in PAIRS)


def test_verb_moves_to_the_end_of_each_clause():
    tgt_clauses = [c for _, tgt in PAIRS for c in clauses(tgt, {"und", "aber"})]
    src_clauses = [c for src, _ in PAIRS for c in clauses(src, {"and", "but"})]
    assert all(c[-1] in TARGET_VERBS for c in tgt_clauses)
    # In the source the verb is clause-final only when nothing follows it.
    assert sum(c[-1] in SOURCE_VERBS for c in src_clauses) < 0.5 * len(src_clauses)


def test_adjectives_follow_nouns_and_articles_agree():
    checks = {
        r"^the big dog ": "der hund gross ",         # subject: nominative masculine
        r" (sees|saw) the dog ": " den hund ",       # object: accusative masculine
        r" with the dog ": " mit dem hund ",         # after a preposition: dative
        r" in the (dog|garden|tree|ball|house|car|book|horse) ": " im ",  # two source tokens, one target
        r" a bicycle ": " fahr rad ",                # one source token, two target tokens
    }
    for pattern, expected in checks.items():
        matches = [(s, t) for s, t in PAIRS if re.search(pattern, s)]
        assert matches, pattern
        assert all(expected in f" {t} " for _, t in matches), pattern


def test_past_tense_agrees_with_subject_number_in_target_only():
    singular = [t for s, t in PAIRS if re.match(r"^(the|a) (dog|cat|man) saw ", s)]
    plural = [t for s, t in PAIRS if re.match(r"^(the|some) (dogs|cats|men) saw ", s)]
    assert singular and plural
    assert all(" sah " in t for t in singular) and all(" sahen " in t for t in plural)


def test_write_translation_corpus(tmp_path):
    sizes = {"train": 40, "valid": 5, "test": 5}
    paths = write_translation_corpus(tmp_path / "a", seed=3, sizes=sizes)
    again = write_translation_corpus(tmp_path / "b", seed=3, sizes=sizes)
    for split, n in sizes.items():
        src_path, tgt_path = paths[split]
        assert src_path.name == f"{split}.src" and tgt_path.name == f"{split}.tgt"
        assert len(read_parallel(src_path, tgt_path)) == n
        assert src_path.read_bytes() == again[split][0].read_bytes()
    assert paths["valid"][0].read_text() != paths["test"][0].read_text()


# --- tagging ------------------------------------------------------------------------------

TAGGED = generate_tagging(2000, seed=5)


def test_tagging_is_deterministic_with_upos_tags():
    assert generate_tagging(30, seed=5) == TAGGED[:30]
    assert generate_tagging(30, seed=6) != TAGGED[:30]
    tags = Counter(t for s in TAGGED for t in s.tags)
    assert set(tags) <= UPOS and len(tags) >= 12
    assert all(s.tags[-1] == "PUNCT" and 2 <= len(s) <= 40 for s in TAGGED)


def test_tags_depend_on_context():
    seen: dict[str, set[str]] = defaultdict(set)
    for s in TAGGED:
        for w, t in zip(s.words, s.tags):
            seen[w].add(t)
    for word, tags in {"book": {"NOUN", "VERB"}, "light": {"ADJ", "NOUN", "VERB"}, "to": {"ADP", "PART"},
                       "fast": {"ADJ", "ADV"}}.items():
        assert seen[word] == tags, word


def test_rare_words_have_regular_suffixes():
    suffixes = ("ness", "ize", "ous", "ously")
    rare = Counter((w, t) for s in TAGGED for w, t in zip(s.words, s.tags) if w.endswith(suffixes))
    assert len(rare) > 50
    suffix_tag = {"ness": "NOUN", "ize": "VERB", "ously": "ADV", "ous": "ADJ"}
    for word, tag in rare:
        assert tag == next(t for suffix, t in suffix_tag.items() if word.endswith(suffix)), word
    assert sum(n == 1 for n in rare.values()) > 10  # a long tail of words seen once


def test_write_tagging_corpus_round_trips_through_read_conllu(tmp_path):
    paths = write_tagging_corpus(tmp_path, seed=2, sizes={"train": 60, "dev": 10, "test": 10})
    assert {p.name for p in paths.values()} == {"train.conllu", "dev.conllu", "test.conllu"}
    train = read_conllu(paths["train"])
    assert len(train) == 60 and len(read_conllu(paths["test"])) == 10
    text = paths["train"].read_text(encoding="utf-8")
    assert text.count("# sent_id = ") == 60 and text.count("# text = ") == 60 and text.endswith("\n\n")
    token_lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(len(line.split("\t")) == 10 for line in token_lines)
    # The same sentences written again are read back unchanged.
    write_conllu(tmp_path / "copy.conllu", train)
    assert read_conllu(tmp_path / "copy.conllu") == train


@pytest.mark.parametrize("n", [0, 1])
def test_small_sizes(n):
    assert len(generate_translation(n, seed=0)) == n and len(generate_tagging(n, seed=0)) == n
