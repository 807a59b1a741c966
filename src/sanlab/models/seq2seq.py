"""Encoder-decoder translation model and its step function for search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.positions import MemoryKeys, Positions
from sanlab.layers.transformer import Decoder, DecoderLayerState, Encoder
from sanlab.models.embeddings import position_vectors


@dataclass(frozen=True)
class DecodeState:
    """Everything a decoding step needs; all tensors have the batch (x beam) on dim 0."""

    memory: Tensor                      # [b, j, dim] encoder output
    memory_valid: Tensor                # [b, j] True for real source tokens
    layers: list[DecoderLayerState] | None = None
    offset: int = 0                     # number of target tokens already decoded
    memory_keys: MemoryKeys | None = None  # the cross-attention's keys, kept from step to step (not reordered)
    # the source side, the same in every beam of a sentence (read by decoding.cache.reorder)
    beam_shared_fields: ClassVar[tuple[str, ...]] = ("memory", "memory_valid")


class Seq2Seq(nn.Module):
    """Transformer encoder-decoder with optionally shared embeddings and a tied generator."""

    def __init__(self, *, src_embed: nn.Module, tgt_embed: nn.Module, src_positions: nn.Module,
                 tgt_positions: nn.Module, encoder: Encoder,
                 decoder: Decoder, dim: int, vocab_size: int, pad_id: int, dropout: float, tie_output: bool,
                 max_length: int | None = None):
        super().__init__()
        self.max_length = max_length  # longest token sequence on either side it accepts (model.max_positions)
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.src_positions, self.tgt_positions = src_positions, tgt_positions  # the same module if sinusoidal
        self.register_load_state_dict_pre_hook(_one_position_table_per_side)
        self.encoder, self.decoder = encoder, decoder
        self.dropout = nn.Dropout(dropout)
        self.pad_id = pad_id
        self.generator = nn.Linear(dim, vocab_size, bias=False)
        if tie_output:
            self.generator.weight = tgt_embed.weight
        else:  # fairseq's untied output projection (and the released MUSE/DynamicConv code): N(0, d^-1/2)
            nn.init.normal_(self.generator.weight, mean=0.0, std=dim ** -0.5)

    def _check_length(self, side: str, length: int) -> None:
        """The one check of a side's length (cached tokens included) against ``max_length``: sinusoidal positions
        exist for every position, so without it a longer sequence than the model was built for would pass."""
        if self.max_length is not None and length > self.max_length:
            raise ValueError(f"{side} of {length} tokens is longer than the model accepts "
                             f"(model.max_positions = {self.max_length}); raise it or filter longer sentences")

    def _embed(self, embed: nn.Module, table: nn.Module, tokens: Tensor, positions: Positions) -> Tensor:
        return self.dropout(embed(tokens) + position_vectors(table, positions)[None])  # [b, t, dim]

    def encode(self, src: Tensor, *, traces: list | None = None) -> tuple[Tensor, Tensor]:
        """src [b, j] -> memory [b, j, dim], memory_valid [b, j]."""
        self._check_length("source", src.shape[1])
        valid = src.ne(self.pad_id)
        pos = Positions.self_attention(valid, length=src.shape[1], device=src.device)
        x = self._embed(self.src_embed, self.src_positions, src, pos)
        return self.encoder(x, positions=pos, traces=traces), valid

    def decode(self, tgt_in: Tensor, *, memory: Tensor, memory_valid: Tensor, states=None, offset: int = 0,
               use_cache: bool = False, traces: list | None = None):
        """tgt_in [b, i] (tokens at positions offset..offset+i-1) -> logits [b, i, V], new layer states."""
        h, states = self._decode_hidden(tgt_in, memory=memory, memory_valid=memory_valid, states=states,
                                        offset=offset, use_cache=use_cache, traces=traces)
        return self.generator(h), states

    def _decode_hidden(self, tgt_in: Tensor, *, memory: Tensor, memory_valid: Tensor, states=None, offset: int = 0,
                       use_cache: bool = False, traces: list | None = None, memory_keys: MemoryKeys | None = None):
        """``decode`` up to the decoder's output [b, i, dim], before the output projection."""
        if offset and not use_cache:  # the earlier positions' keys live only in a cache
            raise ValueError(f"decode at offset {offset} needs use_cache=True (without a cache decode from 0)")
        self._check_length("target", offset + tgt_in.shape[1])
        valid = None if use_cache else tgt_in.ne(self.pad_id)
        pos = Positions.self_attention(valid, length=tgt_in.shape[1], offset=offset, causal=True, device=tgt_in.device)
        cross = Positions.cross_attention(pos, memory_valid, memory_length=memory.shape[1], keys=memory_keys)
        x = self._embed(self.tgt_embed, self.tgt_positions, tgt_in, pos)
        return self.decoder(x, memory=memory, positions=pos, cross_positions=cross, states=states,
                            use_cache=use_cache, traces=traces)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits [b, i, V]."""
        memory, memory_valid = self.encode(src)
        logits, _ = self.decode(tgt_in, memory=memory, memory_valid=memory_valid)
        return logits

    # --- the interface search sees -------------------------------------------------------
    def start_decoding(self, src: Tensor) -> DecodeState:
        memory, memory_valid = self.encode(src)
        return DecodeState(memory=memory, memory_valid=memory_valid)

    def decode_step(self, tokens: Tensor, state: DecodeState) -> tuple[Tensor, DecodeState]:
        """tokens [n, 1] (last token per hypothesis) -> log-probabilities [n, V], next state.

        The output projection runs in the weights' precision even under autocast: bf16 logits keep about three
        significant digits (near 10 they lie 0.06 apart), which would decide close choices of the search
        differently from fp32. The rest of the step keeps the caller's autocast."""
        keys = state.memory_keys
        if keys is None or not keys.serves(state.memory_valid, state.memory.shape[1]):  # the first step, or rows left
            keys = MemoryKeys(state.memory_valid, memory_length=state.memory.shape[1], device=tokens.device)
        h, layers = self._decode_hidden(tokens, memory=state.memory, memory_valid=state.memory_valid,
                                        states=state.layers, offset=state.offset, use_cache=True, memory_keys=keys)
        with torch.autocast(h.device.type, enabled=False):
            logits = self.generator(h[:, -1].to(self.generator.weight.dtype))
        log_probs = F.log_softmax(logits.float(), dim=-1)
        return log_probs, DecodeState(state.memory, state.memory_valid, layers, state.offset + tokens.shape[1], keys)


def _one_position_table_per_side(module, state_dict, prefix, *args) -> None:
    """Weights saved before learned positions had one table per side (one ``positions`` table served
    both) load into both tables."""
    old = f"{prefix}positions.table.weight"
    if old in state_dict:
        table = state_dict.pop(old)
        for side in ("src_positions", "tgt_positions"):
            state_dict.setdefault(f"{prefix}{side}.table.weight", table)
