"""CoNLL-U reading: multiword tokens and empty nodes skipped, exact line numbers on errors."""

from __future__ import annotations

import gzip

import conllu
import pytest

from sanlab.data.conllu_io import TaggedSentence, chunk_sentences, read_conllu, with_tags, write_conllu
from sanlab.errors import DataError


def row(*cols: str) -> str:
    return "\t".join(cols) + "\n"


GOOD = (
    "# sent_id = 1\n"
    "# text = I don't know.\n"
    + row("1", "I", "I", "PRON", "PRP", "_", "4", "nsubj", "_", "_")
    + row("2-3", "don't", "_", "_", "_", "_", "_", "_", "_", "_")
    + row("2", "do", "do", "AUX", "VBP", "_", "4", "aux", "_", "_")
    + row("3", "n't", "not", "PART", "RB", "_", "4", "advmod", "_", "_")
    + row("4", "know", "know", "VERB", "VB", "_", "0", "root", "_", "SpaceAfter=No")
    + row("4.1", "it", "it", "PRON", "PRP", "_", "_", "_", "4:obj", "_")
    + row("5", ".", ".", "PUNCT", ".", "_", "4", "punct", "_", "_")
    + "\n\n"  # several blank lines between sentences are tolerated
    + "# sent_id = 2\n"
    + row("1", "Hi", "hi", "INTJ", "UH", "_", "0", "root", "_", "_")
    + "\n"
)


@pytest.mark.parametrize("name", ["good.conllu", "good.conllu.gz"])
def test_reads_words_and_tags_skipping_multiword_tokens_and_empty_nodes(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(GOOD)
    else:
        path.write_text(GOOD, encoding="utf-8")
    sentences = read_conllu(path)
    assert sentences == [
        TaggedSentence(("I", "do", "n't", "know", "."), ("PRON", "AUX", "PART", "VERB", "PUNCT")),
        TaggedSentence(("Hi",), ("INTJ",)),
    ]
    assert read_conllu(path, column="xpos")[0].tags == ("PRP", "VBP", "RB", "VB", ".")


def good_lines() -> list[str]:
    return GOOD.splitlines(keepends=True)


# (1-based line to replace, replacement, expected problem); line 5 is the token "do".
MALFORMED = [
    (5, row("2", "do", "do", "AUX", "VBP", "_", "4", "aux", "_"), "expected 10 tab-separated columns, found 9"),
    (5, "2 do do AUX VBP _ 4 aux _ _\n", "expected 10 tab-separated columns, found 1"),
    (5, row("two", "do", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "invalid token ID 'two'"),
    (5, row("²", "do", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "invalid token ID '²'"),  # "²".isdigit()
    (5, row("3", "do", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "token ID 3 out of sequence (expected 2)"),
    (5, row("2", "do", "do", "_", "VBP", "_", "4", "aux", "_", "_"), "missing UPOS tag ('_') for word 'do'"),
    (5, row("2", "", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "empty FORM column"),
    (5, row("2", "do  it", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "two consecutive spaces"),
    (5, row("2", "do", "do", "AUX ", "VBP", "_", "4", "aux", "_", "_"), "leading or trailing whitespace in UPOS"),
    (5, row("2", " do", "do", "AUX", "VBP", "_", "4", "aux", "_", "_"), "leading or trailing whitespace in FORM"),
    (5, row("2", "do", "do", " ", "VBP", "_", "4", "aux", "_", "_"), "leading or trailing whitespace in UPOS"),
]


@pytest.mark.parametrize(("lineno", "replacement", "problem"), MALFORMED)
def test_malformed_line_names_file_line_and_problem(tmp_path, lineno, replacement, problem):
    lines = good_lines()
    lines[lineno - 1] = replacement
    path = tmp_path / "bad.conllu"
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_conllu(path)
    assert str(info.value).startswith(f"{path}:{lineno}: ")
    assert problem in str(info.value)
    assert (info.value.path, info.value.line) == (str(path), lineno)


def test_conllu_plus_columns_are_refused_unless_they_are_the_standard_ten(tmp_path):
    path = tmp_path / "plus.conllu"
    path.write_text("# global.columns = ID FORM UPOS HEAD DEPREL MISC PARSEME:MWE\n" + GOOD, encoding="utf-8")
    with pytest.raises(DataError, match=r"plus.conllu:1: CoNLL-U Plus columns .* are not supported"):
        read_conllu(path)
    path.write_text("# global.columns = ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC\n" + GOOD, encoding="utf-8")
    plain = tmp_path / "plain.conllu"
    plain.write_text(GOOD, encoding="utf-8")
    assert read_conllu(path) == read_conllu(plain)


def test_missing_xpos_is_an_error_only_when_requested(tmp_path):
    lines = good_lines()
    lines[12] = row("1", "Hi", "hi", "INTJ", "_", "_", "0", "root", "_", "_")  # line 13
    path = tmp_path / "x.conllu"
    path.write_text("".join(lines), encoding="utf-8")
    assert len(read_conllu(path)) == 2
    with pytest.raises(DataError, match=r"x\.conllu:13: missing XPOS tag"):
        read_conllu(path, column="xpos")


def test_two_spaces_in_misc_are_accepted(tmp_path):
    """UD allows spaces in MISC; only two spaces in ID..XPOS could shift the columns that are read."""
    lines = good_lines()
    lines[4] = row("2", "do", "do", "AUX", "VBP", "_", "4", "aux", "_", "Gloss=do  it")
    path = tmp_path / "x.conllu"
    path.write_text("".join(lines), encoding="utf-8")
    assert read_conllu(path)[0].tags == ("PRON", "AUX", "PART", "VERB", "PUNCT")


def test_sentence_without_words(tmp_path):
    path = tmp_path / "x.conllu"
    path.write_text(GOOD + "# sent_id = 3\n# text = nothing\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"x\.conllu:15: sentence has no word lines"):
        read_conllu(path)


@pytest.mark.parametrize("old, new, problem", [
    ("2-3\tdon't", "4-6\tdon't", r"x\.conllu:4: multiword token 4-6 must come right before word 4"),  # not before 4
    ("2-3\tdon't", "2-2\tdon't", r"x\.conllu:4: multiword token 2-2 must come right before word 2 and span"),
    ("4\tknow", "4-6\tknow.\t_\t_\t_\t_\t_\t_\t_\t_\n4\tknow", r"x\.conllu:7: multiword token ends at word 6, "
                                                                 r"beyond the sentence's last word 5"),
])
def test_a_multiword_range_out_of_place_or_beyond_the_sentence_is_named(tmp_path, old, new, problem):
    path = tmp_path / "x.conllu"
    path.write_text(GOOD.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(DataError, match=problem):
        read_conllu(path)


def test_empty_file_and_bad_column(tmp_path):
    path = tmp_path / "empty.conllu"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty\.conllu: no sentences"):
        read_conllu(path)
    with pytest.raises(ValueError, match="column"):
        read_conllu(path, column="deprel")  # type: ignore[arg-type]


@pytest.mark.parametrize("encode", [
    lambda text: text.replace("\n", "\r\n").encode("utf-8"),                 # Windows line ends
    lambda text: b"\xef\xbb\xbf" + text.encode("utf-8"),                     # a UTF-8 byte-order mark
    lambda text: text.rstrip("\n").encode("utf-8"),                          # no newline after the last line
    lambda text: (text + "\n \n\t\n\n").encode("utf-8"),                     # blank lines at the end
    lambda text: gzip.compress(("\ufeff" + text.replace("\n", "\r\n")).encode("utf-8")),  # all at once, gzipped
], ids=["crlf", "bom", "no-final-newline", "trailing-blank-lines", "gzip-bom-crlf"])
def test_line_ends_a_byte_order_mark_and_trailing_blank_lines_read_as_the_plain_file(tmp_path, encode):
    plain = tmp_path / "plain.conllu"
    plain.write_text(GOOD, encoding="utf-8")
    other = tmp_path / "other.conllu.gz"
    other.write_bytes(encode(GOOD))
    if not other.read_bytes().startswith(b"\x1f\x8b"):
        other = other.rename(tmp_path / "other.conllu")
    assert read_conllu(other) == read_conllu(plain)
    assert read_conllu(other, column="xpos") == read_conllu(plain, column="xpos")


def test_write_then_read_round_trip(tmp_path):
    sentences = [
        TaggedSentence(("Tom", "runs", "fast", "!"), ("PROPN", "VERB", "ADV", "PUNCT")),
        TaggedSentence(("hi", ",", "you"), ("INTJ", "PUNCT", "PRON")),
    ]
    path = tmp_path / "out.conllu"
    write_conllu(path, sentences, no_space_before=frozenset({"PUNCT"}))
    assert read_conllu(path) == sentences
    parsed = conllu.parse(path.read_text(encoding="utf-8"))
    assert [s.metadata["text"] for s in parsed] == ["Tom runs fast!", "hi, you"]
    assert parsed[0][2]["misc"] == {"SpaceAfter": "No"}
    with pytest.raises(ValueError, match="whitespace"):
        write_conllu(path, [TaggedSentence(("a b",), ("X",))])


def test_chunk_sentences_splits_without_dropping():
    words = tuple("abcdefg")
    sentence = TaggedSentence(words, tuple(w.upper() for w in words))
    chunks = chunk_sentences([sentence, TaggedSentence(("x",), ("X",))], max_len=3)
    assert [c.words for c in chunks] == [("a", "b", "c"), ("d", "e", "f"), ("g",), ("x",)]
    assert [c.tags for c in chunks][2] == ("G",)
    with pytest.raises(ValueError):
        chunk_sentences([sentence], max_len=0)
    with pytest.raises(ValueError, match="2 words but 1 tags"):
        TaggedSentence(("a", "b"), ("X",))


@pytest.mark.parametrize("text, expected", [
    ("# sent_id = 1\n1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n", True),
    ("\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n", True),
    ("the dog runs .\n", False),
    ("#hashtag starts a tweet\nthe dog runs .\n", False),
    ("a\tb\tc\n", False),  # tabs, but not the ten columns, nor a word ID first
    ("", False),
    # meant as CoNLL-U but malformed: read as CoNLL-U, so that the bad line is an error, not tagged as words
    ("1\tthe\t_\t_\t_\t_\t_\t_\t_\n", True),              # nine columns
    ("# sent_id = 1\n1 the _ _ _ _ _ _ _ _\n", True),          # spaces for tabs, after CoNLL-U's comment
    ("# text = the dog\n", True),
    ("01\tthe\t_\t_\t_\t_\t_\t_\t_\t_\n", True),          # a bad ID in ten columns
    ("# a comment of plain text\n1 the dog\n", False),
])
def test_conllu_is_recognised_by_its_first_word_line(text, expected):
    from sanlab.data.conllu_io import looks_like_conllu

    assert looks_like_conllu(text.splitlines()) is expected


def test_with_tags_fills_the_tag_column_of_word_lines_only():
    lines = ["# sent_id = a", "1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_", "1\tdo\tdo\t_\t_\t_\t_\t_\t_\t_",
             "2\tn't\tnot\t_\t_\t_\t_\t_\t_\t_", "2.1\tx\t_\t_\t_\t_\t_\t_\t_\t_", "", "",
             "1\tgo\t_\tVERB\tOLD\t_\t_\t_\t_\t_"]
    out = "".join(with_tags(lines, [["AUX", "PART"], ["VB"]], column="xpos"))
    assert out == ("# sent_id = a\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tdo\tdo\t_\tAUX\t_\t_\t_\t_\t_\n"
                   "2\tn't\tnot\t_\tPART\t_\t_\t_\t_\t_\n2.1\tx\t_\t_\t_\t_\t_\t_\t_\t_\n\n"
                   "1\tgo\t_\tVERB\tVB\t_\t_\t_\t_\t_\n\n")


def test_with_tags_refuses_tags_that_do_not_line_up_with_the_sentences():
    lines = ["1\tgo\t_\t_\t_\t_\t_\t_\t_\t_", "", "1\tnow\t_\t_\t_\t_\t_\t_\t_\t_"]
    with pytest.raises(ValueError, match="1 tagged sentences for 2 sentences"):
        list(with_tags(lines, [["VERB"]]))
    with pytest.raises(ValueError, match="line 3: 2 tags for a sentence of 1 words"):
        list(with_tags(lines, [["VERB"], ["ADV", "X"]]))


def test_old_mac_line_endings_are_named(tmp_path):
    path = tmp_path / "mac.conllu"
    path.write_bytes(b"1\tgo\t_\tVERB\t_\t_\t_\t_\t_\t_\r2\tnow\t_\tADV\t_\t_\t_\t_\t_\t_\r\r")
    with pytest.raises(DataError, match=r"mac.conllu:1: the file has no \\n line ends but carriage returns: .* lone "
                                        r"\\r \(old Mac style\)"):  # (found as its lines are read: parallel.open_text)
        read_conllu(path)
    path.write_bytes(b"# sent_id = 1\n1\tgo\t_\tVERB\t_\t_\t_\t_\t_\t_\r2\tnow\t_\tADV\t_\t_\t_\t_\t_\t_\n\n")
    with pytest.raises(DataError, match=r"mac.conllu:2: expected 10 tab-separated columns, found 19 \(the line holds "
                                        r"carriage returns: .* lone \\r, old Mac style"):  # some \r, some \n
        read_conllu(path)


@pytest.mark.parametrize("text, expected", [
    ("# text messages are fun .\nthe dog runs\n", False),   # plain text whose first word is "text"
    ("# newdoc\n# sent_id = a\n1\tx\t_\t_\t_\t_\t_\t_\t_\t_\n", True),
    ("# newdoc id = n01\n", True),
    ("# newdocs are here\n", False),
])
def test_only_conllus_own_comments_make_a_file_conllu(text, expected):
    from sanlab.data.conllu_io import looks_like_conllu

    assert looks_like_conllu(text.splitlines()) is expected
