"""Sequence tagger of Dufter, Schmitt & Schuetze (COLING 2020), section 2.1 and spec C.10.

embed = [word (+ position for PE[add]) ; (position for PE[con]) ; char-CNN(word)]
h     = SAN layers(embed)
tags  = softmax(W [embed ; h] + b)        (the classifier also sees the embedding: a
                                           residual "from the beginning to the end")
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sanlab.attention.dufter_utils import glorot_uniform_
from sanlab.attention.positions import Positions
from sanlab.layers.transformer import Encoder
from sanlab.models.embeddings import LearnedPositions, position_vectors

POSITION_MODES = ("add", "concat", "none")


@dataclass(frozen=True)
class CharWords:
    """A batch's words as the character CNN reads them: each distinct character sequence once, and which of
    them each word slot is. Made on the host with the batch (``tasks.tagging.encode_batch``): ``torch.unique``'s
    output size depends on the values, so on a GPU it would make every forward wait for the device."""

    distinct: Tensor  # [u, c] char ids
    index: Tensor     # [b, t] row of ``distinct`` for each word slot

    @staticmethod
    def of(chars: Tensor) -> "CharWords":
        """chars [b, t, c] -> its distinct words."""
        b, t, c = chars.shape
        distinct, index = torch.unique(chars.reshape(b * t, c), dim=0, return_inverse=True)
        return CharWords(distinct, index.view(b, t))


class CharCNN(nn.Module):
    """Character embedding -> n x [Conv1d(same padding), ReLU] -> max over characters.

    Each word's vector depends on its characters only, so the network runs once per distinct character
    sequence of the batch and is gathered back (``distinct_words``, on by default): a batch of 32 chunks
    has ~1,300 word slots, most of them padding or repeats ("the", ","), and the convolutions were most of
    a tagger update. Off, it runs every slot; the two agree in values and gradients (tested, and timed in
    ``bench/char_cnn.py``)."""

    def __init__(self, *, num_chars: int, dim: int, filters: int, width: int, layers: int,
                 train_pad_row: bool = False):
        super().__init__()
        # the PAD row is drawn like the others (Keras uniform) and, unless trained, kept as drawn
        self.embed = nn.Embedding(num_chars, dim, padding_idx=None if train_pad_row else 0)
        nn.init.uniform_(self.embed.weight, -0.05, 0.05)
        convs, in_dim = [], dim
        for _ in range(layers):
            convs.append(nn.Conv1d(in_dim, filters, kernel_size=width, padding=width // 2))
            in_dim = filters
        self.convs = nn.ModuleList(convs)
        self.out_dim = filters if layers else dim
        self.distinct_words = True

    def forward(self, chars: Tensor, distinct: CharWords | None = None) -> Tensor:
        """chars [b, t, c] -> word vectors [b, t, filters]; ``distinct`` is ``CharWords.of(chars)`` when the batch
        brings it (else made here)."""
        b, t, c = chars.shape
        if not self.distinct_words:
            return self._words(chars.reshape(b * t, c)).view(b, t, -1)
        distinct = CharWords.of(chars) if distinct is None else distinct
        words = self._words(distinct.distinct)  # [u, filters]
        # gathered in fp32: the backward sums the gradients of every repeat (thousands of "<PAD>" slots
        # without the padding mask), which a bf16 sum under autocast would lose
        return words.float()[distinct.index].to(words.dtype)  # [b, t, filters]

    def _words(self, chars: Tensor) -> Tensor:
        x = self.embed(chars).transpose(1, 2)  # [n, dim, c]
        for conv in self.convs:
            x = torch.relu(conv(x))  # [n, filters, c]
        return x.max(dim=-1).values  # [n, filters]


def keras_dense_init_(tagger: "Tagger") -> None:
    """Keras' defaults for the char CNN's convolutions and the classifier (spec C.10): Glorot-uniform
    kernels (a Conv1D kernel's fans are width x channels) and zero biases."""
    for layer in [*tagger.char_cnn.convs, tagger.classifier]:
        width = layer.kernel_size[0] if isinstance(layer, nn.Conv1d) else 1
        fan_in, fan_out = layer.weight.shape[1] * width, layer.weight.shape[0] * width
        glorot_uniform_(layer.weight, fan_in=fan_in, fan_out=fan_out)
        nn.init.zeros_(layer.bias)


class Tagger(nn.Module):
    """Word + char-CNN embeddings, positions added or concatenated, an encoder stack, a classifier."""

    def __init__(self, *, vocab_size: int, word_dim: int, char_cnn: CharCNN, position_mode: str,
                 position_dim: int, max_len: int, encoder: Encoder, num_tags: int,
                 classifier_sees_embedding: bool = True, mask_padding: bool = True, train_pad_row: bool = False):
        super().__init__()
        if position_mode not in POSITION_MODES:
            raise ValueError(f"unknown position mode {position_mode!r}; choose one of {POSITION_MODES}")
        self.word_embed = nn.Embedding(vocab_size, word_dim, padding_idx=None if train_pad_row else 0)
        nn.init.uniform_(self.word_embed.weight, -0.05, 0.05)
        self.char_cnn, self.encoder = char_cnn, encoder
        self.position_mode, self.mask_padding, self.max_len = position_mode, mask_padding, max_len
        pos_dim = word_dim if position_mode == "add" else position_dim
        self.positions = (LearnedPositions(max_positions=max_len, dim=pos_dim, size_key="model.max_len")
                          if position_mode != "none" else None)
        self.model_dim = word_dim + (position_dim if position_mode == "concat" else 0) + char_cnn.out_dim
        self.classifier_sees_embedding = classifier_sees_embedding
        self.classifier = nn.Linear(self.model_dim * (2 if classifier_sees_embedding else 1), num_tags)

    @property
    def pad_to(self) -> int | None:
        """The length every batch must be padded to, or None for "the batch's longest chunk".

        Without the padding mask (the reference behaviour, spec C.10) every chunk is padded to t and
        attends over its padding, so the padding must not depend on which chunks share a batch.
        """
        return None if self.mask_padding else self.max_len

    def embed(self, words: Tensor, chars: Tensor, positions: Positions, char_words: CharWords | None = None) -> Tensor:
        w = self.word_embed(words)  # [b, t, word_dim]
        if self.position_mode != "none":
            table = position_vectors(self.positions, positions)[None]  # [1, t, pos_dim]
            w = w + table if self.position_mode == "add" else torch.cat([w, table.expand(w.shape[0], -1, -1)], dim=-1)
        return torch.cat([w, self.char_cnn(chars, char_words)], dim=-1)  # [b, t, model_dim]

    def forward(self, words: Tensor, chars: Tensor, *, char_words: CharWords | None = None,
                traces: list | None = None) -> Tensor:
        """words [b, t] (0 = pad), chars [b, t, c] -> tag logits [b, t, num_tags]; ``char_words``: the batch's
        ``CharWords.of(chars)``, when it brings it."""
        if words.shape[1] > self.max_len:  # (a shape: no device read) refused in every position mode, not only
            # where a learned table or a part sized t would fail later, and less plainly
            raise ValueError(f"a chunk of {words.shape[1]} words is longer than the tagger's t = {self.max_len} "
                             "(model.max_len): split sentences into chunks of at most t words, as tag_sentences does")
        valid = words.ne(0) if self.mask_padding else None
        positions = Positions.self_attention(valid, length=words.shape[1], device=words.device)
        e = self.embed(words, chars, positions, char_words)
        h = self.encoder(e, positions=positions, traces=traces)
        return self.classifier(torch.cat([e, h], dim=-1) if self.classifier_sees_embedding else h)
