"""The two layer kinds the builder chooses between (layers/transformer.py): sequential sublayers, or one residual
around a parallel block (MUSE) that holds the FFN and, in the decoder, possibly the cross-attention."""

import pytest
from torch import nn

from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.layers.transformer import DecoderLayer, EncoderLayer, FeedForward
from sanlab.models.builders import build_seq2seq

D = 8


def _layers(mixer: dict):
    stack = StackConfig(layers=1, ffn_dim=12, attention={"heads": 2}, mixer=mixer)
    model = build_seq2seq(Seq2SeqConfig(dim=D, dropout=0.1, encoder=stack, decoder=stack), vocab_size=9, pad_id=0)
    return model.encoder.layers[0], model.decoder.layers[0]


@pytest.mark.parametrize("mixer, ffn_in_layer, cross_in_layer", [
    ({"type": "attention"}, True, True),
    ({"type": "dynamic_conv"}, True, True),
    ({"type": "muse_ff"}, False, False),
    ({"type": "muse_ff", "decoder_cross": "sequential"}, False, True),
])
def test_the_builder_picks_the_layer_kind_from_the_mixer_config(mixer, ffn_in_layer, cross_in_layer):
    encoder, decoder = _layers(mixer)
    assert (encoder.ffn is not None, decoder.ffn is not None) == (ffn_in_layer, ffn_in_layer)
    assert (decoder.cross_attention is not None) == cross_in_layer
    assert decoder.mixer_memory == (not cross_in_layer)  # the block's own cross-attention branch gets the source
    residual_dropout = 0.1 if ffn_in_layer else 0.0  # a parallel block drops out each branch itself
    assert encoder.mixer_res.dropout.p == decoder.self_res.dropout.p == residual_dropout


def test_a_parallel_layer_refuses_an_ffn_of_its_own_and_kinds_are_checked():
    ffn = FeedForward(dim=D, hidden=12)
    with pytest.raises(ValueError, match="parallel layer's FFN is a branch of its mixer"):
        EncoderLayer(mixer=nn.Identity(), ffn=ffn, dim=D, kind="parallel")
    with pytest.raises(ValueError, match="unknown layer kind 'diagonal'"):
        DecoderLayer(self_mixer=nn.Identity(), cross_attention=None, ffn=None, dim=D, kind="diagonal")
