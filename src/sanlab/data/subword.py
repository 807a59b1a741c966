"""Subword segmentation: a thin wrapper around a SentencePiece model with fixed special ids.

Every model trained here uses the same special ids (pad=0, unk=1, bos=2, eos=3), so the
embedding tables, padding masks and decoders can rely on them. Translation normally uses one
joint model trained on source and target text (`train_joint`), which lets the two embedding
tables be tied.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import sentencepiece as spm

from sanlab.errors import DataError

# runs of the space SentencePiece decodes "▁" to (not other whitespace, which a piece may hold)
_EXTRA_SPACES = re.compile(" {2,}")

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
ModelType = Literal["unigram", "bpe"]


def _model_prefix(model_path: str | os.PathLike[str]) -> Path:
    """`dir/name` or `dir/name.model` -> `dir/name` (SentencePiece appends `.model`/`.vocab`)."""
    path = Path(model_path)
    return path.with_suffix("") if path.suffix == ".model" else path


def _non_empty(texts: Iterable[str], counter: list[int]) -> Iterator[str]:
    # SentencePiece treats each item as one sentence; blank items only waste a slot.
    for text in texts:
        if text.strip():
            counter[0] += 1
            yield text


def _model_proto_class():
    """SentencePiece's ModelProto message class, or None where protobuf is missing or older than the one
    sentencepiece's generated code was made with (its import checks the version and raises)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except Exception:  # ImportError, or protobuf's VersionError
        return None
    return sentencepiece_model_pb2.ModelProto


class IncompleteModel(DataError):
    """SentencePiece's files, written without an error, are not whole (a full disk; see ``_check_written``)."""


def _check_written(staging: Path) -> None:
    """SentencePiece reports success when its files could not be written whole (on a full disk: seen on a full
    tmpfs), and a model cut short after a few pieces even loads. It writes the model first, then the vocabulary,
    one line a piece: both are whole when the model loads and the vocabulary lists each of its pieces."""
    model, vocab = (staging.with_name(staging.name + suffix) for suffix in (".model", ".vocab"))
    try:
        processor = spm.SentencePieceProcessor()
        processor.Load(str(model))
        whole = vocab.read_bytes().count(b"\n") == processor.GetPieceSize()
    except (OSError, RuntimeError):
        whole = False
    if not whole:
        model.unlink(missing_ok=True)
        vocab.unlink(missing_ok=True)
        free = shutil.disk_usage(staging.parent).free
        raise IncompleteModel(f"sentencepiece wrote an incomplete model, without an error (as it does on a full disk; "
                              f"{free:,} bytes free there now)", path=str(staging.parent))


class SubwordModel:
    """A loaded SentencePiece model: encode text to ids and decode ids back to text."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path):
        self._sp = processor
        self.path = path
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        actual = {
            "pad": processor.pad_id(), "unk": processor.unk_id(), "bos": processor.bos_id(), "eos": processor.eos_id()
        }
        if actual != expected:
            problem = f"special ids are {actual}, sanlab needs {expected}; retrain with SubwordModel.train"
            raise DataError(problem, path=str(path))
        self._specials = frozenset((PAD_ID, BOS_ID, EOS_ID))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SubwordModel:
        """Load `path` (with or without the `.model` suffix)."""
        prefix = _model_prefix(path)
        model_file = prefix.with_name(prefix.name + ".model")
        if not model_file.is_file():
            raise DataError("SentencePiece model not found", path=str(model_file))
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(model_file))
        except (OSError, RuntimeError) as exc:
            raise DataError(f"not a SentencePiece model: {exc}", path=str(model_file)) from exc
        return cls(processor, model_file)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        *,
        model_path: str | os.PathLike[str],
        vocab_size: int,
        model_type: ModelType = "unigram",
        character_coverage: float = 1.0,
        seed: int = 0,
        sample: int | None = None,
    ) -> SubwordModel:
        """Train a model on `texts` (one sentence each; any iterable, read once), write it and load it.

        Writes `<model_path>.model` and `<model_path>.vocab`. `vocab_size` is an upper bound:
        a tiny corpus yields fewer pieces instead of failing. Training is single-threaded and
        seeds SentencePiece's global generator with `seed`, so the same texts give the same
        pieces and scores. With `sample` = n, SentencePiece trains on n sentences drawn at random
        (reservoir sampling while it reads, so memory stays bounded) with every core: for corpora of
        millions of sentences, where all of them in one thread would take hours.
        """
        if model_type not in ("unigram", "bpe"):
            raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
        if vocab_size <= 4:
            raise ValueError(f"vocab_size must exceed the 4 special pieces, got {vocab_size}")
        prefix = _model_prefix(model_path)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        # SentencePiece writes its files in place: train under a temporary name and rename, so a crash
        # never leaves a truncated model that a resumed run would load (the .model file lands last).
        staging = prefix.with_name(f".{prefix.name}.{os.getpid()}.tmp")
        spm.set_random_generator_seed(seed)
        n_texts = [0]
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_non_empty(texts, n_texts),
                model_prefix=str(staging),
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                hard_vocab_limit=False,
                # One thread and no input sampling make the result a function of the texts.
                num_threads=1 if sample is None else os.cpu_count() or 1,
                input_sentence_size=sample or 0,
                shuffle_input_sentence=sample is not None,
                # its default (4,192 bytes) leaves longer lines out of training without a word
                max_sentence_length=1 << 20,
                minloglevel=2,
            )
        except RuntimeError as exc:
            for suffix in (".vocab", ".model"):
                staging.with_name(staging.name + suffix).unlink(missing_ok=True)
            problem = "no non-empty texts to train on" if n_texts[0] == 0 else f"SentencePiece training failed: {exc}"
            raise DataError(problem, path=str(prefix)) from exc
        _check_written(staging)
        for suffix in (".vocab", ".model"):
            os.replace(staging.with_name(staging.name + suffix), prefix.with_name(prefix.name + suffix))
        return cls.load(prefix)

    def digest(self) -> str:
        """A short hash of the vocabulary itself, its pieces and their scores in id order: what segmentation
        depends on. The ``.model`` file's bytes would not do: its trainer spec holds the path it was trained
        under. Two models with one digest segment every text alike; SentencePiece versions can train different
        models from the same texts and seed (0.2.2 and 0.2.3 do on Multi30k), which this tells apart."""
        sp = self._sp
        pieces = "\n".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i)!r}" for i in range(sp.get_piece_size()))
        return hashlib.sha256(pieces.encode("utf-8")).hexdigest()[:16]

    def encoding_digest(self) -> str:
        """A hash of everything in the model that encoding reads: its pieces, normaliser and trainer options,
        without what only says where and how fast it was trained (the staging path in ``model_prefix``, which
        differs every time a model is trained, input files, thread count). Two copies of one model, or the
        same model trained again from the same texts in another place, have one encoding digest, so an
        encoded corpus cached under it is shared by them. Where protobuf cannot read the model, the hash of
        its bytes: as safe, only shared by fewer copies."""
        serialized = self._sp.serialized_model_proto()
        model_proto = _model_proto_class()
        if model_proto is None:
            return hashlib.sha256(serialized).hexdigest()
        proto = model_proto()
        proto.ParseFromString(serialized)
        for where in ("model_prefix", "input", "num_threads"):
            proto.trainer_spec.ClearField(where)
        return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Piece ids of `text`, without BOS/EOS (add them where the model needs them)."""
        return self._sp.EncodeAsIds(text)

    def encode_pieces(self, text: str) -> list[str]:
        """Piece strings of `text` (word starts are marked with '▁')."""
        return self._sp.EncodeAsPieces(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; pad, BOS and EOS ids are ignored wherever they occur.

        Spaces are normalised as SentencePiece normalises its input (`remove_extra_whitespaces`,
        on in every model sanlab trains): a hypothesis that emits word-start pieces back to back
        would otherwise read "a  dog " although no text the model learned from has such spaces.
        """
        text = self._sp.DecodeIds([int(i) for i in ids if int(i) not in self._specials])
        return _EXTRA_SPACES.sub(" ", text).strip(" ")

    def id_to_piece(self, piece_id: int) -> str:
        if not 0 <= piece_id < self.vocab_size:
            raise IndexError(f"piece id {piece_id} outside the vocabulary of {self.vocab_size}")
        return self._sp.IdToPiece(piece_id)

    def piece_to_id(self, piece: str) -> int:
        """Id of `piece`, or `unk_id` if the model has no such piece."""
        return self._sp.PieceToId(piece)

    # --- vocabulary -----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"SubwordModel(path={str(self.path)!r}, vocab_size={self.vocab_size})"


def train_joint(
    src_texts: Iterable[str],
    tgt_texts: Iterable[str],
    *,
    model_path: str | os.PathLike[str],
    vocab_size: int,
    model_type: ModelType = "unigram",
    character_coverage: float = 1.0,
    seed: int = 0,
    sample: int | None = None,
) -> SubwordModel:
    """Train one model on source and target text together (a joint vocabulary)."""
    return SubwordModel.train(
        itertools.chain(src_texts, tgt_texts),
        model_path=model_path,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        seed=seed,
        sample=sample,
    )


class SubwordPair:
    """The source and the target subword model of a translation run: one joint model used on both
    sides (the default), or two separate ones. The special ids are the same in every model here,
    so padding and BOS/EOS never depend on the side."""

    def __init__(self, src: SubwordModel, tgt: SubwordModel | None = None):
        self.src, self.tgt = src, tgt if tgt is not None else src
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    @property
    def joint(self) -> bool:
        return self.src is self.tgt

    def vocabulary(self) -> str:
        """What a model trained with these subword models is tied to (its embedding rows): their pieces and
        scores (``SubwordModel.digest``), one for a joint model. Not ``encoding_digest``, which depends on
        whether this machine's protobuf can read the model: a run trained on one machine must load on another."""
        digests = [self.src.digest()] + ([] if self.joint else [self.tgt.digest()])
        return "+".join(digests)

    def __repr__(self) -> str:
        return f"SubwordPair(joint={self.src!r})" if self.joint else f"SubwordPair(src={self.src!r}, tgt={self.tgt!r})"
