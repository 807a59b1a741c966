"""Translation: subword data preparation, batches, loss, validation BLEU, and batched decoding."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.config import DecodeConfig, TranslationConfig
from sanlab.data.batching import EpochPlan, TokenBatchSampler, pad_batch
from sanlab.data.parallel import length_filter, read_parallel
from sanlab.data.subword import SubwordPair
from sanlab.decoding.search import Hypothesis, beam_search, rescore
from sanlab.errors import ConfigError, DataError, DecodingError
from sanlab.files import write_text
from sanlab.evaluation.bleu import corpus_scores
from sanlab.models.builders import build_seq2seq
from sanlab.models.seq2seq import Seq2Seq
from sanlab.tasks.base import task_for
from sanlab.tasks.translation_data import load_subwords, no_pair_kept
from sanlab.tasks.translation_data import prepare as prepare_training_data
from sanlab.training.device import Precision, evaluation_mode, model_device, out_of_memory_stops, to_device
from sanlab.training.layout import RunLayout
from sanlab.training.logging import RunLogger


@dataclass(frozen=True)
class Batch:
    src: Tensor       # [b, j] source ids + EOS, right-padded
    tgt_in: Tensor    # [b, i] BOS + target ids
    tgt_out: Tensor   # [b, i] target ids + EOS
    tokens: int       # real target tokens (the loss is normalised by these)

    def describe(self) -> str:
        return (f"{self.src.shape[0]} pairs padded to {self.src.shape[1]} source and {self.tgt_in.shape[1]} target "
                f"positions, {self.tokens:,} target tokens")


@dataclass(frozen=True)
class PendingBatch:
    """A training batch not read yet: its pairs and its target tokens (known from the lengths alone), so an
    update is normalised by every process's tokens while each process reads only the batches it trains on."""
    indices: np.ndarray
    tokens: int

    def describe(self) -> str:
        return f"{len(self.indices)} pairs, {self.tokens:,} target tokens"


class PendingBatches(Sequence):
    """An epoch's ``PendingBatch``es, made when indexed (``batches[k]``, slices)."""

    def __init__(self, plan: EpochPlan, tgt_lengths: np.ndarray):
        self.plan, self.tgt_lengths = plan, tgt_lengths

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        indices = self.plan[k]
        return PendingBatch(indices, int(self.tgt_lengths[indices].sum(dtype=np.int64)) + len(indices))  # + EOS each


def encode_pairs(spm: SubwordPair, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    return [(spm.src.encode(s), spm.tgt.encode(t)) for s, t in pairs]


def collate(spm: SubwordPair, examples: list[tuple[list[int], list[int]]], *, multiple: int = 1,
            at_most: int | None = None) -> Batch:
    """Source, decoder input and output of ``examples``, each padded to its longest (rounded up to ``multiple``,
    not past ``at_most``: the model's positions)."""
    pad = functools.partial(pad_batch, pad_id=spm.pad_id, multiple=multiple, at_most=at_most)
    src, _ = pad([s + [spm.eos_id] for s, _ in examples])
    tgt_in, _ = pad([[spm.bos_id] + t for _, t in examples])
    tgt_out, _ = pad([t + [spm.eos_id] for _, t in examples])
    return Batch(src, tgt_in, tgt_out, tokens=int(tgt_out.ne(spm.pad_id).sum()))


def build_model(config: TranslationConfig, spm: SubwordPair) -> Seq2Seq:
    return build_seq2seq(config.model, vocab_size=spm.src.vocab_size, pad_id=spm.pad_id,
                         tgt_vocab_size=None if spm.joint else spm.tgt.vocab_size)


class TranslationTask:
    """Implements ``training.loop.TrainTask`` for a Seq2Seq model."""

    def __init__(self, config: TranslationConfig, run_dir: Path, log: RunLogger, *, main: bool = True):
        """``main=False``: a distributed run's other processes, which read the subword model(s) the main process
        wrote into ``run_dir`` and write none (``translation_data.subwords``)."""
        self.config, self.log = config, log
        self.metric, self.higher_is_better = task_for(config).best_metric(config)  # bleu unless train.best_metric
        d = config.data
        tests = {pair.src: read_parallel(pair.src, pair.tgt, keep_empty=True)  # a missing or misaligned test set is
                 for pair in d.test.values()}  # found now, not by `evaluate` after training
        self.train = prepare_training_data(config, run_dir, log=log.info, main=main)
        self.spm = self.train.spm
        for path, pairs in tests.items():  # and so is a source sentence `evaluate` could not translate
            for line, (source, _) in enumerate(pairs, start=1):
                n = len(self.spm.src.encode(source)) + 1 if source.strip() else 0  # (+ EOS; blank: no translation)
                if n > config.model.max_positions:
                    raise DataError(f"{n} subword tokens (with end of sentence), more than model.max_positions = "
                                    f"{config.model.max_positions} accepts: `sanlab evaluate` could not translate "
                                    "this test sentence; raise model.max_positions", path=str(path), line=line)
        self.vocabulary = self.spm.vocabulary()  # in every checkpoint's meta.json (checkpoint.check_vocabulary)
        lengths = self.train.lengths
        for files, corpus in zip(d.train_corpora, self.train.corpora):
            if not len(corpus):  # a cache entry written before the encoder refused an empty corpus
                raise no_pair_kept(config, files)
        sizes = (f"{self.spm.src.vocab_size}" if self.spm.joint
                 else f"{self.spm.src.vocab_size} source, {self.spm.tgt.vocab_size} target")
        log.info(f"training pairs: {len(lengths):,} (max_len {d.max_len}); vocabulary {sizes}")
        weighted = len(self.train.corpora) > 1  # several corpora: sampled by weight
        self.sampler = TokenBatchSampler(lengths + np.ones(1, lengths.dtype), max_tokens=config.train.max_tokens,
                                         shuffle=True, seed=config.train.seed,  # + EOS / BOS
                                         corpus_sizes=[len(c) for c in self.train.corpora] if weighted else None,
                                         weights=[c.weight for c in d.train_corpora] if weighted else None,
                                         pad_multiple=config.train.length_multiple)
        if self.sampler.oversized:
            log.info(f"WARNING: {len(self.sampler.oversized)} training pairs are longer than train.max_tokens = "
                     f"{config.train.max_tokens} alone and get a batch of their own, over the budget "
                     f"(raise train.max_tokens or lower data.max_len)")
        self.valid_raw = read_parallel(d.valid.src, d.valid.tgt, skip_empty=d.skip_empty, log=log.info)
        self.valid = encode_pairs(self.spm, self.valid_raw)
        if d.filter_valid:
            self._filter_valid(log)
        longest = max(range(len(self.valid)), key=lambda k: max(map(len, self.valid[k])))
        if max(map(len, self.valid[longest])) + 1 > config.model.max_positions:  # found now, not at update 250
            counted = d.skip_empty or d.filter_valid
            which = f"validation pair {longest + 1} (counted after data.skip_empty)" if counted else "this pair"
            side = 0 if len(self.valid[longest][0]) >= len(self.valid[longest][1]) else 1  # (the file to name)
            raise DataError(f"{which} has {len(self.valid[longest][side])} subword tokens on this side, more than "
                            f"model.max_positions = {config.model.max_positions} allows",
                            path=str((d.valid.src, d.valid.tgt)[side]), line=None if counted else longest + 1)
        torch.manual_seed(config.train.seed)
        self.model = build_model(config, self.spm)

    def _filter_valid(self, log: RunLogger) -> None:
        """``data.filter_valid``: the validation pairs the training filter would keep (the test sets stay whole)."""
        d = self.config.data
        keep = length_filter(self.valid, max_len=d.max_len, max_ratio=d.max_ratio)
        limits = f"data.max_len {d.max_len}" + (f" and data.max_ratio {d.max_ratio}" if d.max_ratio else "")
        if not keep:
            raise DataError(f"no validation pair has 1 to {limits} subword tokens a side (data.filter_valid)",
                            path=str(d.valid.src))
        log.info(f"validation pairs: {len(keep):,} of {len(self.valid):,} kept within {limits} (data.filter_valid)")
        self.valid_raw, self.valid = [self.valid_raw[k] for k in keep], [self.valid[k] for k in keep]

    def epoch_batches(self, epoch: int) -> PendingBatches:
        return PendingBatches(self.sampler.epoch_plan(epoch), self.train.lengths[:, 1])

    def read(self, batch: PendingBatch) -> Batch:
        """The batch's pairs, read from the encoded corpus."""
        return collate(self.spm, [tuple(side.tolist() for side in self.train.pair(int(k))) for k in batch.indices],
                       multiple=self.config.train.length_multiple, at_most=self.config.model.max_positions)

    def batch_tokens(self, batch: Batch | PendingBatch) -> int:
        return batch.tokens

    def loss(self, batch: Batch | PendingBatch, *, model: torch.nn.Module | None = None,
             label_smoothing: float | None = None) -> Tensor:
        if isinstance(batch, PendingBatch):
            batch = self.read(batch)
        model = self.model if model is None else model
        batch = to_device(batch, model_device(model))  # validation's batches are built on the CPU
        logits = model(batch.src, batch.tgt_in)  # [b, i, V]
        ls = self.config.train.label_smoothing if label_smoothing is None else label_smoothing
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=self.spm.pad_id,
                               label_smoothing=ls, reduction="sum")

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        self.model.eval()
        # summed on the device in float64 (the same sum as Python floats) and read once, not once per batch
        total, tokens = torch.zeros((), dtype=torch.float64, device=model_device(self.model)), 0
        for start in range(0, len(self.valid), 64):
            batch = collate(self.spm, self.valid[start:start + 64])
            total += self.loss(batch, label_smoothing=0.0).double()
            tokens += batch.tokens
        loss = float(total) / tokens
        n = self.config.train.valid_max_sentences
        n = len(self.valid_raw) if n is None else n
        if not n:  # valid_max_sentences 0: the loss alone (train.best_metric is loss or ppl)
            return {"loss": loss, "ppl": perplexity(loss)}
        if not math.isfinite(loss):  # outputs not finite: nothing to decode (the trainer stops on it)
            return {"loss": loss, "ppl": loss, "bleu": 0.0}
        sources, refs = [s for s, _ in self.valid_raw[:n]], [t for _, t in self.valid_raw[:n]]
        hyps = translate(self.model, self.spm, sources, decode=self.config.decode.updated(beam=1, n_best=1))
        return {"loss": loss, "ppl": perplexity(loss), "bleu": corpus_scores(hyps, refs).bleu}


def perplexity(loss: float) -> float:
    """exp(loss) in float64, inf where it overflows: in float32, losses a few ulps apart tie in ppl, which would
    then pick the best checkpoint (train.best_metric: ppl) otherwise than the loss does."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def max_output_lengths(src_len: torch.Tensor, decode: DecodeConfig, limit: int | None) -> torch.Tensor:
    """Output tokens allowed per sentence, EOS included: fairseq's ``int(a * source length + b)`` tokens (the
    source counting its EOS) and then EOS, at most ``limit`` (the decoder reads positions 0..L-1). In
    float64 like fairseq's Python floats: float32 gives 126 for int(1.3 * 90 + 10)."""
    lengths = (src_len.double() * decode.max_len_a + decode.max_len_b).long() + 1
    return lengths if limit is None else lengths.clamp(max=limit)


def translate(model: Seq2Seq, spm: SubwordPair, sentences: list[str], *, decode: DecodeConfig,
              n_best: int = 1, source: str | None = None,
              precision: Precision | None = None) -> list[str] | list[list[tuple[str, float]]]:
    """Detokenised translations in input order (with ``n_best`` > 1: lists of (text, score)); an empty sentence
    gets an empty translation (score 0), as would one whose search found no hypothesis (which a search that forces
    EOS at the length limit cannot do). The search is ``search_translations``."""
    found = search_translations(model, spm, sentences, decode=decode, n_best=n_best, source=source,
                                precision=precision)
    results = [[(spm.tgt.decode(h.tokens), h.score) for h in nbest] or [("", 0.0)] for nbest in found]
    return [r[0][0] for r in results] if n_best == 1 else results


def search_translations(model: Seq2Seq, spm: SubwordPair, sentences: list[str], *, decode: DecodeConfig,
                        n_best: int = 1, source: str | None = None,
                        precision: Precision | None = None) -> list[list[Hypothesis]]:
    """Each sentence's ``n_best`` hypotheses (subword ids), best first, in input order; none for an empty one.

    ``precision`` (default fp32): the model's encoder pass and decoder steps run under its autocast; the
    step's output projection and log-softmax (``Seq2Seq.decode_step``) and the beam search's scores stay in
    fp32, and the weights are cast once per batch (``Precision.cast_cache``). In bf16 the search keeps all its
    finished hypotheses (up to ``decode.beam``), and the fp32 model scores them again in one teacher-forced
    pass and chooses among them (``rescore_in_fp32``): bf16's rounding (about 3 significant digits) otherwise
    decides between near-equal hypotheses differently from fp32, and the scores returned are fp32's.

    An empty sentence has nothing to translate and gets no hypothesis. A sentence longer than the model
    accepts (``model.max_positions``) is a DataError naming its line of ``source``; the length allowed to a
    translation is capped there too. ``n_best`` below 1 or above ``decode.beam`` is a ConfigError. The model decodes in
    eval mode and is left in the mode it was in.
    """
    if isinstance(sentences, str):  # it would be translated character by character
        raise TypeError("translate() and search_translations() take a list of sentences, got one str: "
                        "pass [sentence]")
    if n_best < 1:  # (decode.n_best is checked by the config; an argument from Python is not)
        raise ConfigError(f"n_best = {n_best}: ask for at least 1 hypothesis per sentence")
    if n_best > decode.beam:  # (bf16 would return fewer without a word: its search keeps `beam` hypotheses)
        raise ConfigError(f"n_best = {n_best} is more than decode.beam = {decode.beam}: a beam search keeps "
                          f"{decode.beam} hypotheses; raise the beam or ask for fewer")
    with evaluation_mode(model), torch.no_grad():
        return _search(model, spm, sentences, decode=decode, n_best=n_best, source=source, precision=precision)


def _search(model: Seq2Seq, spm: SubwordPair, sentences: list[str], *, decode: DecodeConfig, n_best: int,
            source: str | None, precision: Precision | None) -> list[list[Hypothesis]]:
    # empty: nothing but spaces, or only what the subword model drops (a zero-width space, a stray BOM)
    ids = [x + [spm.eos_id] if x else [] for x in (spm.src.encode(s) if s.strip() else [] for s in sentences)]
    limit = model.max_length
    for k, x in enumerate(ids):
        if limit is not None and len(x) > limit:
            raise DataError(f"{len(x)} subword tokens (with end of sentence), more than the model accepts "
                            f"(model.max_positions = {limit}); split the sentence", path=source or "<input>", line=k + 1)
    results: list[list[Hypothesis]] = [[] for _ in ids]
    precision = precision or Precision("fp32", model_device(model))

    def step(tokens: Tensor, state):
        with precision.autocast():  # the search itself (scores, top-k, EOS bookkeeping) runs outside it
            return model.decode_step(tokens, state)

    order = sorted((k for k, x in enumerate(ids) if x), key=lambda k: len(ids[k]))  # similar lengths share a batch
    for start in range(0, len(order), decode.batch_sentences):
        chunk = order[start:start + decode.batch_sentences]
        src, _ = pad_batch([ids[k] for k in chunk], spm.pad_id)
        src = to_device(src, model_device(model))  # the search's state follows max_lengths' device
        src_len = src.ne(spm.pad_id).sum(-1)
        max_lengths = max_output_lengths(src_len, decode, limit)
        again = precision.name != "fp32"  # then the search keeps every finished hypothesis for fp32 to choose
        with _out_of_memory_stops(src, source, decode):
            with precision.cast_cache():  # the weights cast to bf16 once per batch, not at every step
                with precision.autocast():
                    state = model.start_decoding(src)
                hyps = beam_search(step, state, batch_size=len(chunk), beam_size=decode.beam,
                                   bos=spm.bos_id, eos=spm.eos_id, pad=spm.pad_id, max_lengths=max_lengths,
                                   length_penalty=decode.length_penalty,
                                   length_penalty_style=decode.length_penalty_style,
                                   n_best=decode.beam if again else max(n_best, 1))
            if again:
                hyps = [h[:max(n_best, 1)] for h in rescore_in_fp32(model, src, hyps, spm=spm, decode=decode)]
        for k, nbest in zip(chunk, hyps):
            results[k] = nbest
    return results


def _out_of_memory_stops(src: Tensor, source: str | None, decode: DecodeConfig):
    """A batch of sentences whose search does not fit the device's memory: a DecodingError saying what to try."""
    where = (f"decoding {src.shape[0]} sentences of up to {src.shape[1]} subword tokens"
             + (f" from {source}" if source else "") + f" with beam {decode.beam}")
    return out_of_memory_stops(src.device, where=where, error=DecodingError, advice=(
        f"Decode fewer sentences at a time (--batch-sentences on translate and evaluate; the run's "
        f"decode.batch_sentences is {decode.batch_sentences}), with a smaller --beam, --precision bf16, or on "
        "another device (--device)."))


def rescore_in_fp32(model: Seq2Seq, src: Tensor, hyps: list[list[Hypothesis]], *, spm: SubwordPair,
                    decode: DecodeConfig) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses (``src`` [B, S] its sources) scored by ``model`` in fp32, teacher-forced, in
    chunks of ``decode.batch_sentences`` hypotheses, and ranked by that score (``search.rescore``). The batch
    is encoded once, as the search encoded it; each hypothesis reads its sentence's memory."""
    rows = [(b, h) for b, nbest in enumerate(hyps) for h in nbest]
    memory, memory_valid = model.encode(src)  # outside any autocast: fp32
    positional: list[list[float]] = []
    for start in range(0, len(rows), decode.batch_sentences):
        part = rows[start:start + decode.batch_sentences]
        tgt_in, _ = pad_batch([[spm.bos_id] + h.tokens for _, h in part], spm.pad_id)
        gold, _ = pad_batch([h.tokens + [spm.eos_id] for _, h in part], spm.pad_id)
        index = torch.tensor([b for b, _ in part], device=src.device)
        logits, _ = model.decode(tgt_in.to(src.device), memory=memory.index_select(0, index),
                                 memory_valid=memory_valid.index_select(0, index))
        logits = logits.float()  # [n, L, V]
        token_lp = F.log_softmax(logits, dim=-1).gather(2, gold.to(src.device).unsqueeze(2)).squeeze(2).tolist()
        positional += [lp[:len(h.tokens) + 1] for lp, (_, h) in zip(token_lp, part)]
    out: list[list[Hypothesis]] = [[] for _ in hyps]
    for (b, _), lp in zip(rows, positional):
        out[b].append(lp)
    return [rescore(nbest, scores, length_penalty=decode.length_penalty,
                    length_penalty_style=decode.length_penalty_style) for nbest, scores in zip(hyps, out)]


def load_translation_model(config: TranslationConfig, run_dir: Path) -> tuple[Seq2Seq, SubwordPair]:
    """The run's model (untrained weights) and subword model(s), without reading any corpus."""
    spm = load_subwords(run_dir, joint=config.data.subword.joint)
    return build_model(config, spm), spm


def write_hypotheses(path: Path, hyps: list[str]) -> None:
    """One hypothesis per line, each ending in "\\n" (an empty hypothesis is an empty line)."""
    write_text(path, "".join(h + "\n" for h in hyps))


def read_hypotheses(path: Path) -> list[str]:
    """What ``write_hypotheses`` wrote. Not ``splitlines()``: that also splits at U+2028, U+0085 and
    the like, which a hypothesis may contain."""
    text = Path(path).read_text(encoding="utf-8")
    return text.removesuffix("\n").split("\n") if text else []


def evaluate_translation(model: Seq2Seq, spm: SubwordPair, config: TranslationConfig, *, splits: list[str] | None,
                         decode: DecodeConfig, out_dir: Path, tag: str, precision: Precision | None = None) -> dict:
    """BLEU and chrF (sacreBLEU, detokenised output vs raw references) on the named test splits
    (default: all of ``data.test``, else the validation set), decoded in ``precision`` (default fp32; the
    hypotheses file's name carries any other, ``RunLayout.hypotheses``)."""
    precision = precision or Precision("fp32", model_device(model))
    files = dict(config.data.test) or {"valid": config.data.valid}
    if splits:
        unknown = [s for s in splits if s not in files and s != "valid"]
        if unknown:
            raise ConfigError(f"unknown split(s) {unknown}; this run has: {', '.join(dict.fromkeys(['valid', *files]))}")
        files = {s: files.get(s, config.data.valid) for s in splits}
    # every line of a test set is scored (data.skip_empty applies to training and validation only): an empty
    # source has nothing to translate, so its hypothesis is empty. Every split is read before any is decoded,
    # and the hypotheses files are written only once all are scored: a split that fails leaves the files of
    # the others as their eval record describes them (the caller writes the record after this returns).
    raws = {name: read_parallel(pair.src, pair.tgt, keep_empty=True) for name, pair in files.items()}
    decoded = {name: translate(model, spm, [s for s, _ in raw], decode=decode, source=str(files[name].src),
                               precision=precision) for name, raw in raws.items()}
    results = {}
    for name, hyps in decoded.items():
        scores = corpus_scores(hyps, [t for _, t in raws[name]])
        hyp_path = RunLayout(out_dir).hypotheses(tag, name, precision.name)
        write_hypotheses(hyp_path, hyps)
        results[name] = {"bleu": scores.bleu, "chrf": scores.chrf, "bleu_signature": scores.bleu_signature,
                         "chrf_signature": scores.chrf_signature, "formatted": scores.format(),
                         "hypotheses": hyp_path.name, "sentences": len(raws[name]),  # (beside the record)
                         "hypotheses_sha256": hypotheses_digest(hyps), "decode": decode.model_dump()}
    return results


def hypotheses_digest(hyps: list[str]) -> str:
    """The sha256 of the hypotheses file ``write_hypotheses`` writes for ``hyps``: kept in the eval record, so
    that a file which no longer matches its record (replaced by an evaluation that failed before its record
    was written) is refused by what reads the two together."""
    return hashlib.sha256("".join(h + "\n" for h in hyps).encode("utf-8")).hexdigest()
