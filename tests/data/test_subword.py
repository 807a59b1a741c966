"""SentencePiece wrapper: fixed special ids, round trip, determinism, joint training."""

from __future__ import annotations

import pytest

from sanlab.data.subword import SubwordModel, train_joint
from sanlab.data.synthetic import generate_translation
from sanlab.errors import DataError

PAIRS = generate_translation(400, seed=3)
SRC = [s for s, _ in PAIRS]
TGT = [t for _, t in PAIRS]


@pytest.fixture(scope="module")
def joint(tmp_path_factory) -> SubwordModel:
    return train_joint(SRC, TGT, model_path=tmp_path_factory.mktemp("spm") / "joint", vocab_size=200)


def test_special_ids_and_pieces(joint):
    assert (joint.pad_id, joint.unk_id, joint.bos_id, joint.eos_id) == (0, 1, 2, 3)
    assert [joint.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert 4 < joint.vocab_size <= 200 and len(joint) == joint.vocab_size
    with pytest.raises(IndexError):
        joint.id_to_piece(joint.vocab_size)


@pytest.mark.parametrize("text", [SRC[0], TGT[1], "the small dog often sleeps under einem baum ."])
def test_round_trip(joint, text):
    ids = joint.encode(text)
    assert all(4 <= i < joint.vocab_size for i in ids)
    assert joint.decode(ids) == text
    assert "".join(joint.encode_pieces(text)).replace("\u2581", " ").strip() == text


def test_decode_ignores_pad_bos_eos(joint):
    ids = joint.encode(SRC[2])
    assert joint.decode([joint.bos_id, *ids, joint.eos_id, joint.pad_id, joint.pad_id]) == SRC[2]


def test_decode_normalises_spaces_as_sentencepiece_normalises_input(joint):
    # A model may emit word-start pieces back to back ("▁", "▁", "the"): the text has no runs of
    # spaces and no edge spaces, as no normalised training sentence has.
    space = joint.piece_to_id("\u2581")
    assert space != joint.unk_id
    hypothesis = [space, space, *joint.encode("the"), space, space, *joint.encode("dog"), space]
    assert joint.decode(hypothesis) == "the dog"
    assert joint.decode([space, space]) == ""


def test_joint_vocabulary_covers_both_sides(joint):
    # A word seen only on the target side is encoded without unknown pieces.
    assert joint.unk_id not in joint.encode("strasse maenner baeume")


def test_training_is_deterministic_and_accepts_model_suffix(tmp_path):
    a = SubwordModel.train(SRC, model_path=tmp_path / "a" / "m.model", vocab_size=80, model_type="bpe")
    b = SubwordModel.train(iter(SRC), model_path=tmp_path / "b" / "m", vocab_size=80, model_type="bpe")
    assert a.path.name == "m.model" and (tmp_path / "a" / "m.vocab").exists()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["m.model", "m.vocab"]  # staging files renamed
    assert [a.id_to_piece(i) for i in range(a.vocab_size)] == [b.id_to_piece(i) for i in range(b.vocab_size)]
    assert a.encode(SRC[5]) == b.encode(SRC[5])


def test_load_with_or_without_suffix(joint):
    for path in (joint.path, joint.path.with_suffix("")):
        loaded = SubwordModel.load(path)
        assert loaded.encode(SRC[3]) == joint.encode(SRC[3])


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match=r"missing\.model: SentencePiece model not found"):
        SubwordModel.load(tmp_path / "missing")
    (tmp_path / "junk.model").write_text("not a model")
    with pytest.raises(DataError, match=r"junk\.model: not a SentencePiece model"):
        SubwordModel.load(tmp_path / "junk.model")


def test_a_training_that_dies_halfway_leaves_no_model_to_resume_from(tmp_path, monkeypatch):
    """SentencePiece writes its files in place; we train under a staging name, so a failure after it began
    writing leaves no m.model that a resumed run would take for a finished one."""
    import sentencepiece as spm

    def dies_after_writing(**options):
        list(options["sentence_iterator"])  # it read the texts
        prefix = options["model_prefix"]
        for suffix in (".model", ".vocab"):
            with open(prefix + suffix, "wb") as f:
                f.write(b"truncated")
        raise RuntimeError("killed while writing")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", dies_after_writing)
    with pytest.raises(DataError, match="SentencePiece training failed"):
        SubwordModel.train(SRC, model_path=tmp_path / "m", vocab_size=80)
    assert list(tmp_path.iterdir()) == []


def test_train_rejects_empty_input(tmp_path):
    with pytest.raises(DataError, match="no non-empty texts"):
        SubwordModel.train(["", "  "], model_path=tmp_path / "m", vocab_size=50)
    assert list(tmp_path.iterdir()) == []  # no model, not even a partial one, for a resume to pick up
    with pytest.raises(ValueError, match="model_type"):
        SubwordModel.train(SRC, model_path=tmp_path / "m", vocab_size=50, model_type="word")  # type: ignore[arg-type]


def test_the_digest_names_the_vocabulary_not_the_file(tmp_path):
    """The same texts and settings give one digest wherever the model was trained (its file holds the path it
    was trained under); other pieces give another."""
    a = SubwordModel.train(SRC, model_path=tmp_path / "a" / "m", vocab_size=80, model_type="bpe")
    b = SubwordModel.train(SRC, model_path=tmp_path / "elsewhere" / "joint", vocab_size=80, model_type="bpe")
    other = SubwordModel.train(SRC, model_path=tmp_path / "c" / "m", vocab_size=90, model_type="bpe")
    assert a.path.read_bytes() != b.path.read_bytes()  # the trainer spec records the training path
    assert a.digest() == b.digest() != other.digest() and len(a.digest()) == 16


def test_the_encoding_digest_ignores_where_a_model_was_trained(tmp_path):
    """What keys an encoded corpus: the model's pieces, normaliser and options, not the staging path in its
    trainer spec; a copy has the digest of its original, and other settings give another."""
    import shutil

    a = SubwordModel.train(SRC, model_path=tmp_path / "a" / "m", vocab_size=80, model_type="bpe")
    b = SubwordModel.train(SRC, model_path=tmp_path / "elsewhere" / "joint", vocab_size=80, model_type="bpe")
    (tmp_path / "copy").mkdir()
    shutil.copyfile(a.path, tmp_path / "copy" / "m.model")
    copy = SubwordModel.load(tmp_path / "copy" / "m")
    assert a.path.read_bytes() != b.path.read_bytes()
    assert a.encoding_digest() == b.encoding_digest() == copy.encoding_digest()
    others = [SubwordModel.train(SRC, model_path=tmp_path / "c" / "m", vocab_size=90, model_type="bpe"),
              SubwordModel.train(SRC, model_path=tmp_path / "d" / "m", vocab_size=80, model_type="unigram"),
              SubwordModel.train(SRC, model_path=tmp_path / "e" / "m", vocab_size=80, model_type="bpe",
                                 character_coverage=0.98)]
    assert len({a.encoding_digest(), *(o.encoding_digest() for o in others)}) == 4


def test_without_protobuf_the_encoding_digest_is_the_files(tmp_path, monkeypatch):
    """Where sentencepiece's generated protobuf code does not import (protobuf missing or too old), the digest
    falls back to the model's bytes: copies still share it, a model trained elsewhere does not."""
    import hashlib

    from sanlab.data import subword

    monkeypatch.setattr(subword, "_model_proto_class", lambda: None)
    a = SubwordModel.train(SRC, model_path=tmp_path / "a" / "m", vocab_size=80, model_type="bpe")
    b = SubwordModel.train(SRC, model_path=tmp_path / "b" / "m", vocab_size=80, model_type="bpe")
    assert a.encoding_digest() == hashlib.sha256(a.path.read_bytes()).hexdigest() != b.encoding_digest()
