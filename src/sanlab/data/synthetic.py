"""Small generated corpora for the demo and the tests: no downloads, deterministic given a seed.

Translation ("English-like" -> "German-like"), built so that locality matters:
- source is SVO, adjectives before the noun, optional prepositional phrases, subject relative
  clauses ("that ...") and a second clause joined by "and"/"but";
- target moves adjectives after the noun (local reordering) and the verb, with any particle,
  to the end of its clause (longer-range reordering, over objects and relative clauses);
- articles and relative pronouns agree with the noun's gender, number and case (subject,
  object, after a preposition), past-tense verbs with the subject's number, which the source
  does not mark; some words become two tokens ("bicycle" -> "fahr rad"), some pairs one
  ("in the garden" -> "im garten");
- the grammar is unambiguous, so the target is a function of the source.
Tagging (UPOS): context-dependent words ("book", "light", "run" are NOUN or VERB, "to" ADP or
PART, "fast" ADJ or ADV) and a Zipf-distributed long tail of invented words with regular
suffixes ("-ness" NOUN, "-ize" VERB, "-ous" ADJ, "-ly" ADV), so unseen words are taggable from
their characters and context.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from sanlab.data.conllu_io import TaggedSentence, write_conllu
from sanlab.files import write_text

# --- translation lexicon ------------------------------------------------------------------
# noun: (plural, gender, target singular, target plural)
_NOUNS = {
    "dog": ("dogs", "m", "hund", "hunde"), "cat": ("cats", "f", "katze", "katzen"),
    "bird": ("birds", "m", "vogel", "voegel"), "house": ("houses", "n", "haus", "haeuser"),
    "child": ("children", "n", "kind", "kinder"), "man": ("men", "m", "mann", "maenner"),
    "woman": ("women", "f", "frau", "frauen"), "ball": ("balls", "m", "ball", "baelle"),
    "car": ("cars", "n", "auto", "autos"), "book": ("books", "n", "buch", "buecher"),
    "garden": ("gardens", "m", "garten", "gaerten"), "tree": ("trees", "m", "baum", "baeume"),
    "horse": ("horses", "n", "pferd", "pferde"), "teacher": ("teachers", "m", "lehrer", "lehrer"),
    "flower": ("flowers", "f", "blume", "blumen"), "street": ("streets", "f", "strasse", "strassen"),
    "bicycle": ("bicycles", "n", "fahr rad", "fahr raeder"), "station": ("stations", "m", "bahn hof", "bahn hoefe"),
}
# verb: (3sg, past, target 3sg, target plural, target past sg, target past pl); particles come first
_TRANSITIVE = {
    "see": ("sees", "saw", "sieht", "sehen", "sah", "sahen"),
    "like": ("likes", "liked", "mag", "moegen", "mochte", "mochten"),
    "find": ("finds", "found", "findet", "finden", "fand", "fanden"),
    "chase": ("chases", "chased", "jagt", "jagen", "jagte", "jagten"),
    "follow": ("follows", "followed", "folgt", "folgen", "folgte", "folgten"),
    "carry": ("carries", "carried", "traegt", "tragen", "trug", "trugen"),
    "call": ("calls", "called", "an ruft", "an rufen", "an rief", "an riefen"),
    "watch": ("watches", "watched", "an schaut", "an schauen", "an schaute", "an schauten"),
}
_INTRANSITIVE = {
    "sleep": ("sleeps", "slept", "schlaeft", "schlafen", "schlief", "schliefen"),
    "run": ("runs", "ran", "laeuft", "laufen", "lief", "liefen"),
    "sit": ("sits", "sat", "sitzt", "sitzen", "sass", "sassen"),
    "wait": ("waits", "waited", "wartet", "warten", "wartete", "warteten"),
    "play": ("plays", "played", "spielt", "spielen", "spielte", "spielten"),
    "laugh": ("laughs", "laughed", "lacht", "lachen", "lachte", "lachten"),
}
_ADJECTIVES = {"big": "gross", "small": "klein", "old": "alt", "young": "jung", "red": "rot",
               "black": "schwarz", "happy": "froh", "tired": "muede", "fast": "schnell", "huge": "sehr gross"}
_ADVERBS = {"often": "oft", "never": "nie", "always": "immer", "sometimes": "manchmal", "quickly": "schnell"}
_PREPOSITIONS = {"in": "in", "on": "auf", "with": "mit", "near": "bei", "under": "unter", "behind": "hinter"}
_CONTRACTIONS = {("in", "dem"): "im", ("bei", "dem"): "beim"}
_CONJUNCTIONS = {"and": "und", "but": "aber"}
# determiner -> case -> forms for (masculine, feminine, neuter, plural); "-" never occurs
_ARTICLES = {
    "the": {"nom": "der die das die", "acc": "den die das die", "dat": "dem der dem den"},
    "a": {"nom": "ein eine ein -", "acc": "einen eine ein -", "dat": "einem einer einem -"},
    "some": {"nom": "- - - einige", "acc": "- - - einige", "dat": "- - - einigen"},
}
_GENDER_SLOT = {"m": 0, "f": 1, "n": 2}
MAX_SOURCE_TOKENS = 20  # including the final "."


class _Phrase(NamedTuple):
    src: list[str]
    tgt: list[str]
    plural: bool = False


def _article(det: str, *, case: str, gender: str, plural: bool) -> str:
    form = _ARTICLES[det][case].split()[3 if plural else _GENDER_SLOT[gender]]
    assert form != "-", (det, case, gender, plural)  # determiners are drawn by number
    return form


def _noun_phrase(rng: random.Random, *, case: str, modifiers: bool) -> _Phrase:
    """DET ADJ* NOUN [PP | relative clause] -> ART NOUN ADJ* [PP | relative clause]."""
    noun = rng.choice(list(_NOUNS))
    src_plural, gender, tgt_sg, tgt_pl = _NOUNS[noun]
    plural = rng.random() < 0.35
    det = rng.choice(("the", "some") if plural else ("the", "a"))
    adjectives = rng.sample(list(_ADJECTIVES), k=rng.choices((0, 1, 2), weights=(5, 3, 1))[0])
    src = [det, *adjectives, src_plural if plural else noun]
    tgt = [_article(det, case=case, gender=gender, plural=plural), *(tgt_pl if plural else tgt_sg).split()]
    tgt += [piece for adj in adjectives for piece in _ADJECTIVES[adj].split()]
    # Never both a PP and a relative clause: "that" must always refer to the noun just before it.
    roll = rng.random() if modifiers else 1.0
    if roll < 0.2:
        pp = _prepositional_phrase(rng)
        src, tgt = src + pp.src, tgt + pp.tgt
    elif roll < 0.35:
        pred = _predicate(rng, plural=plural, modifiers=False)
        src = src + ["that", *pred.src]
        tgt = tgt + [_article("the", case="nom", gender=gender, plural=plural), *pred.tgt]
    return _Phrase(src, tgt, plural)


def _prepositional_phrase(rng: random.Random) -> _Phrase:
    prep = rng.choice(list(_PREPOSITIONS))
    np_ = _noun_phrase(rng, case="dat", modifiers=False)
    tgt = [_PREPOSITIONS[prep], *np_.tgt]
    if (tgt[0], tgt[1]) in _CONTRACTIONS:
        tgt = [_CONTRACTIONS[tgt[0], tgt[1]], *tgt[2:]]
    return _Phrase([prep, *np_.src], tgt)


def _predicate(rng: random.Random, *, plural: bool, modifiers: bool) -> _Phrase:
    """[ADV] VERB [object | PP] -> [ADV] [object | PP] VERB (verb-final)."""
    past = rng.random() < 0.4
    adverb = [rng.choice(list(_ADVERBS))] if rng.random() < 0.2 else []
    if rng.random() < 0.6:
        verb = rng.choice(list(_TRANSITIVE))
        forms, complement = _TRANSITIVE[verb], _noun_phrase(rng, case="acc", modifiers=modifiers)
    else:
        verb = rng.choice(list(_INTRANSITIVE))
        forms = _INTRANSITIVE[verb]
        complement = _prepositional_phrase(rng) if rng.random() < 0.5 else _Phrase([], [])
    src_verb = forms[1] if past else (verb if plural else forms[0])
    tgt_verb = forms[2 + 2 * past + plural]
    src = [*adverb, src_verb, *complement.src]
    tgt = [*(_ADVERBS[a] for a in adverb), *complement.tgt, *tgt_verb.split()]
    return _Phrase(src, tgt)


def _clause(rng: random.Random) -> _Phrase:
    subject = _noun_phrase(rng, case="nom", modifiers=True)
    pred = _predicate(rng, plural=subject.plural, modifiers=True)
    return _Phrase(subject.src + pred.src, subject.tgt + pred.tgt)


def _translation_pair(rng: random.Random) -> tuple[str, str]:
    while True:
        sentence = _clause(rng)
        if rng.random() < 0.3:
            conj, second = rng.choice(list(_CONJUNCTIONS)), _clause(rng)
            sentence = _Phrase(sentence.src + [conj] + second.src, sentence.tgt + [_CONJUNCTIONS[conj]] + second.tgt)
        if len(sentence.src) + 1 <= MAX_SOURCE_TOKENS:
            return " ".join(sentence.src + ["."]), " ".join(sentence.tgt + ["."])


def generate_translation(n: int, *, seed: int) -> list[tuple[str, str]]:
    """`n` (source, target) pairs of space-separated tokens, 4-20 source tokens each."""
    rng = random.Random(seed)
    return [_translation_pair(rng) for _ in range(n)]


def _split_seed(seed: int, split: str) -> int:
    # Independent, reproducible streams per split (str hashing is salted per process; sha256 is not).
    return int.from_bytes(hashlib.sha256(f"{seed}/{split}".encode()).digest()[:8], "little")


def write_translation_corpus(
    out_dir: str | os.PathLike[str],
    *,
    seed: int,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, tuple[Path, Path]]:
    """Write `<split>.src` / `<split>.tgt` for each split; return their paths by split.

    Default sizes are train 20,000 / valid 500 / test 500: generation takes a second, and
    20,000 pairs (~200k source tokens) cover the grammar well enough for a tiny Transformer to
    generalise to unseen sentences within a few minutes of CPU training.
    """
    sizes = dict(sizes or {"train": 20000, "valid": 500, "test": 500})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in sizes.items():
        pairs = generate_translation(n, seed=_split_seed(seed, split))
        src_path, tgt_path = out / f"{split}.src", out / f"{split}.tgt"
        # replaced whole: two grids' processes writing the same corpus at once never show a reader half a file
        write_text(src_path, "".join(s + "\n" for s, _ in pairs))
        write_text(tgt_path, "".join(t + "\n" for _, t in pairs))
        paths[split] = (src_path, tgt_path)
    return paths


# --- tagging ------------------------------------------------------------------------------
_T_NOUNS = "dog cat house city teacher car tree river window friend idea song garden doctor letter box".split()
_T_AMBIGUOUS = "run book light watch play walk park cook paint dance drink dream plant train call".split()
_T_VERBS = "see like find take make read write love help open visit carry know want need".split()
_T_ADJECTIVES = "big small old new red happy quiet dark good cold fast light".split()
_T_PRE_ADVERBS = "often never always sometimes".split()
_T_POST_ADVERBS = "fast quickly slowly today here".split()
_T_ADPOSITIONS = "in on with near under to from at for".split()
_T_PROPER = "Anna Tom Maria Berlin Paris Lena".split()
_T_SUBJECTS = {"I": False, "you": False, "we": False, "they": False, "he": True, "she": True, "it": True}
_T_OBJECTS = "me you us them him her it".split()
_T_IRREGULAR_PAST = {"run": "ran", "see": "saw", "find": "found", "take": "took", "make": "made", "read": "read",
                     "write": "wrote", "know": "knew", "drink": "drank", "light": "lit"}
_RARE_SUFFIXES = {"NOUN": ("ness", "tion", "ment", "ity", "ism"), "ADJ": ("ous", "ful", "ive", "able", "ic"),
                  "ADV": ("ously", "fully", "ively", "ably", "ically"), "VERB": ("ize", "ify", "ate")}
_ONSETS = "b d f g k l m n p r s t v z br tr pl gr st".split()
_CODAS = ["", "", "n", "r", "l", "s", "m"]
_RARE_RATE = 0.12  # chance that an open-class slot takes an invented word


def _inflect(word: str, form: str) -> str:
    """English -s (noun plural / verb 3sg) or -ed (past) with the usual spelling changes."""
    if form == "past" and word in _T_IRREGULAR_PAST:
        return _T_IRREGULAR_PAST[word]
    consonant_y = word.endswith("y") and word[-2] not in "aeiou"
    if form == "past":
        return word[:-1] + "ied" if consonant_y else word + ("d" if word.endswith("e") else "ed")
    if consonant_y:
        return word[:-1] + "ies"
    return word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")


class _TaggingLexicon:
    """Open-class vocabulary plus a Zipf-weighted pool of invented stems (the long tail)."""

    def __init__(self, seed: int, n_stems: int = 600):
        rng = random.Random(_split_seed(seed, "stems"))
        stems: set[str] = set()
        while len(stems) < n_stems:
            stems.add("".join(rng.choice(_ONSETS) + rng.choice("aeiou") + rng.choice(_CODAS) for _ in range(2)))
        self.stems = sorted(stems)  # set order varies between processes (str hashing is salted)
        rng.shuffle(self.stems)
        self.cum_weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(n_stems)))

    def word(self, rng: random.Random, tag: str, known: list[str]) -> str:
        if rng.random() >= _RARE_RATE:
            return rng.choice(known)
        stem = rng.choices(self.stems, cum_weights=self.cum_weights)[0]
        return stem + rng.choice(_RARE_SUFFIXES[tag])


Tokens = list[tuple[str, str]]


def _tag_noun_phrase(rng: random.Random, lex: _TaggingLexicon, *, depth: int = 0) -> tuple[Tokens, bool]:
    """Returns the tokens and whether the phrase is third person singular."""
    if rng.random() < 0.1:
        return [(rng.choice(_T_PROPER), "PROPN")], True
    plural = rng.random() < 0.3
    det_tag = "NUM" if plural and rng.random() < 0.3 else "DET"
    if det_tag == "NUM":
        determiners = ["two", "three", "ten"]
    else:
        determiners = ["the", "some", "these"] if plural else ["the", "a", "this", "every"]
    tokens = [(rng.choice(determiners), det_tag)]
    for _ in range(rng.choices((0, 1, 2), weights=(6, 3, 1))[0]):
        if rng.random() < 0.1:
            tokens.append(("very", "ADV"))
        tokens.append((lex.word(rng, "ADJ", _T_ADJECTIVES), "ADJ"))
    noun = lex.word(rng, "NOUN", _T_NOUNS + _T_AMBIGUOUS)
    tokens.append((_inflect(noun, "s") if plural else noun, "NOUN"))
    if depth == 0 and rng.random() < 0.15:
        tokens += [(rng.choice(_T_ADPOSITIONS), "ADP"), *_tag_noun_phrase(rng, lex, depth=1)[0]]
    return tokens, not plural


def _tag_object(rng: random.Random, lex: _TaggingLexicon) -> Tokens:
    return [(rng.choice(_T_OBJECTS), "PRON")] if rng.random() < 0.2 else _tag_noun_phrase(rng, lex)[0]


def _tag_clause(rng: random.Random, lex: _TaggingLexicon) -> Tokens:
    if rng.random() < 0.25:
        pronoun = rng.choice(list(_T_SUBJECTS))
        tokens, third_singular = [(pronoun, "PRON")], _T_SUBJECTS[pronoun]
    else:
        tokens, third_singular = _tag_noun_phrase(rng, lex)
    verb = lex.word(rng, "VERB", _T_VERBS + _T_AMBIGUOUS)
    if rng.random() < 0.2:
        tokens.append((rng.choice(("will", "can", "must")), "AUX"))
        tokens += [("not", "PART")] if rng.random() < 0.3 else []
        form = verb
    else:
        form = _inflect(verb, "past") if rng.random() < 0.4 else (_inflect(verb, "s") if third_singular else verb)
    if rng.random() < 0.15:
        tokens.append((lex.word(rng, "ADV", _T_PRE_ADVERBS), "ADV"))
    tokens.append((form, "VERB"))
    roll = rng.random()
    if roll < 0.15 and verb in ("want", "need"):
        tokens += [("to", "PART"), (lex.word(rng, "VERB", _T_VERBS + _T_AMBIGUOUS), "VERB"), *_tag_object(rng, lex)]
    elif roll < 0.7:
        tokens += _tag_object(rng, lex)
    if rng.random() < 0.3:
        tokens += [(rng.choice(_T_ADPOSITIONS), "ADP"), *_tag_noun_phrase(rng, lex, depth=1)[0]]
    if rng.random() < 0.15:
        tokens.append((lex.word(rng, "ADV", _T_POST_ADVERBS), "ADV"))
    return tokens


def _tagged_sentence(rng: random.Random, lex: _TaggingLexicon) -> TaggedSentence:
    tokens = _tag_clause(rng, lex)
    roll = rng.random()
    if roll < 0.2:
        tokens += ([(",", "PUNCT")] if rng.random() < 0.5 else []) + [(rng.choice(("and", "but", "or")), "CCONJ")]
        tokens += _tag_clause(rng, lex)
    elif roll < 0.3:
        tokens += [(rng.choice(("because", "when", "if", "while")), "SCONJ"), *_tag_clause(rng, lex)]
    tokens.append((rng.choice((".", ".", ".", "!", "?")), "PUNCT"))
    words, tags = zip(*tokens)
    return TaggedSentence(tuple(words), tuple(tags))


def generate_tagging(n: int, *, seed: int) -> list[TaggedSentence]:
    """`n` sentences with UPOS tags; the invented-word pool and the sentences follow from `seed`."""
    lex, rng = _TaggingLexicon(seed), random.Random(seed)
    return [_tagged_sentence(rng, lex) for _ in range(n)]


def write_tagging_corpus(
    out_dir: str | os.PathLike[str],
    *,
    seed: int,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, Path]:
    """Write `<split>.conllu` (UPOS in column 4) for each split; return their paths by split.

    Default sizes are train 5,000 / dev 500 / test 500 (~55k training tokens). All splits share
    one invented-word pool, so the test set has both seen and unseen rare words.
    """
    sizes = dict(sizes or {"train": 5000, "dev": 500, "test": 500})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lex = _TaggingLexicon(seed)
    paths = {}
    for split, n in sizes.items():
        rng = random.Random(_split_seed(seed, split))
        paths[split] = out / f"{split}.conllu"
        write_conllu(paths[split], (_tagged_sentence(rng, lex) for _ in range(n)), no_space_before=frozenset({"PUNCT"}))
    return paths
