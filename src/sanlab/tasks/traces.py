"""One layer's attention trace of a trained model on one sentence, with token labels (translation, tagging).

Used by ``sanlab analyze attention`` (``experiments/attention_traces.py``) through ``Task.attention_trace``.
The model is called exactly as in training / teacher forcing, with ``traces=[]``: every layer appends its mixer's trace (``scores``, ``weights`` and,
after post-softmax parts, ``weights_final``, each [b, h, i, j]); see ``layers/transformer.py``.
Labels are sentencepiece pieces (translation, with ``</s>`` / ``<s>``) or words (tagging). The inputs go to
the model's device and the trace comes back on the CPU, whatever device the model was loaded on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sanlab.errors import ConfigError
from sanlab.training.device import model_device, to_device

SIDES = ("encoder", "decoder", "cross")


@dataclass(frozen=True)
class LayerTrace:
    trace: dict | None     # the layer's trace dict (None / {} for a mixer without attention), on the CPU
    queries: list[str]     # one label per query position (rows)
    keys: list[str]        # one label per key token (columns; 2D-CSAN repeats them per head block)
    target: str | None     # decoder sides: the target text that was forced

    def __post_init__(self):  # the analysis reads it with numpy
        object.__setattr__(self, "trace", to_device(self.trace, torch.device("cpu")))


def _pick(traces: list, layer: int, what: str):
    if not 0 <= layer < len(traces):
        raise ConfigError(f"layer {layer} does not exist: the {what} has {len(traces)} layers (0..{len(traces) - 1})")
    return traces[layer]


def _check_length(model, tokens: list[int], what: str) -> None:
    if model.max_length is not None and len(tokens) > model.max_length:
        raise ConfigError(f"{what} is {len(tokens)} subword tokens (with BOS/EOS), more than the model accepts "
                          f"(model.max_positions = {model.max_length})")


@torch.no_grad()
def translation_trace(model, spm, config, *, sentence: str, side: str, layer: int, target: str | None) -> LayerTrace:
    """Encoder self-attention, or decoder self/cross-attention with ``target`` teacher-forced
    (default: the model's own translation with the run's decode settings)."""
    from sanlab.evaluation.analysis import split_decoder_traces
    from sanlab.tasks.translation import search_translations

    device = model_device(model)
    src = spm.src.encode(sentence) + [spm.eos_id]
    _check_length(model, src, "the sentence")
    src_labels = [spm.src.id_to_piece(t) for t in src]
    if side == "encoder":
        traces: list = []
        model.encode(torch.tensor([src], device=device), traces=traces)
        return LayerTrace(_pick(traces, layer, "encoder"), src_labels, src_labels, None)
    if target is None:  # the model's own subwords (its text encoded again may split otherwise, or hold ⁇)
        (found,) = search_translations(model, spm, [sentence], decode=config.decode)
        pieces = found[0].tokens if found else []
        target = spm.tgt.decode(pieces)
    else:
        pieces = spm.tgt.encode(target)
    tgt = [spm.bos_id] + pieces
    _check_length(model, tgt, "the target")
    tgt_labels = [spm.tgt.id_to_piece(t) for t in tgt]
    memory, memory_valid = model.encode(torch.tensor([src], device=device))
    traces = []
    model.decode(torch.tensor([tgt], device=device), memory=memory, memory_valid=memory_valid, traces=traces)
    has_cross = [decoder_layer.cross_attention is not None for decoder_layer in model.decoder.layers]
    own, cross = _pick(split_decoder_traces(traces, has_cross=has_cross), layer, "decoder")
    return LayerTrace(own, tgt_labels, tgt_labels, target) if side == "decoder" else \
        LayerTrace(cross, tgt_labels, src_labels, target)


@torch.no_grad()
def tagging_trace(model, vocab, config, *, sentence: str, layer: int) -> LayerTrace:
    """The tagger's encoder self-attention over the words of ``sentence``, split as `sanlab tag` splits a line."""
    from sanlab.data.conllu_io import TaggedSentence, plain_words
    from sanlab.tasks.tagging import PAD_WORD, encode_batch

    words = list(plain_words(sentence))  # the words `sanlab tag` takes from the same line
    if not 0 < len(words) <= config.model.max_len:
        raise ConfigError(f"the sentence has {len(words)} words; the tagger takes 1 to {config.model.max_len} "
                          "(model.max_len) at once")
    batch = to_device(encode_batch(vocab, [TaggedSentence(tuple(words), ("_",) * len(words))],
                                   max_chars=config.model.max_word_chars, pad_to=model.pad_to), model_device(model))
    traces: list = []
    model(batch.words, batch.chars, char_words=batch.char_words, traces=traces)
    # without the padding mask the chunk is padded to t and attends over it: the map shows that padding
    labels = words + [PAD_WORD] * (batch.words.shape[1] - len(words))
    return LayerTrace(_pick(traces, layer, "encoder"), labels, labels, None)
