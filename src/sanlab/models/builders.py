"""Config -> modules. The only place that knows how configs map to layers and models."""

from __future__ import annotations

from torch import nn

from sanlab.attention.build import build_attention
from sanlab.attention.dufter_utils import glorot_normal_attention_
from sanlab.config import Seq2SeqConfig, StackConfig, TaggerConfig
from sanlab.layers.mixers import MIXERS, AttentionMixerConfig, MixerConfig
from sanlab.layers.pre_blocks import PRE_BLOCKS
from sanlab.layers.transformer import Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForward
from sanlab.models.embeddings import LearnedPositions, SinusoidalPositions, TokenEmbedding
from sanlab.models.seq2seq import Seq2Seq
from sanlab.models.tagger import CharCNN, Tagger, keras_dense_init_
from sanlab.registry import BuildContext


def _context(stack: StackConfig, *, dim: int, index: int, side: str, max_len: int) -> BuildContext:
    return BuildContext(dim=dim, heads=stack.attention.heads, layer_index=index, num_layers=stack.layers,
                        side=side, max_len=max_len)


def _ffn(stack: StackConfig, dim: int) -> FeedForward | None:
    # no dropout inside the FFN (fairseq's activation_dropout 0); the residual dropout follows it
    return FeedForward(dim=dim, hidden=stack.ffn_dim, dropout=0.0) if stack.ffn_dim else None


def _layer_mixer(stack: StackConfig, index: int) -> MixerConfig:
    """The stack's mixer in the layers it selects (``mixer.layers``), plain attention in the others."""
    return stack.mixer if stack.mixer.applies_to(index) else AttentionMixerConfig()


def _build_mixer(stack: StackConfig, mixer: MixerConfig, ctx: BuildContext, *, dropout: float,
                 cross: nn.Module | None = None) -> nn.Module:
    """The layer's mixer. A parallel one (MUSE's block) also receives the FFN, the branch dropout and the
    cross-attention branch (None: the layer keeps its own); the layer then gets no FFN."""
    if mixer.layer_kind == "sequential":
        return MIXERS.build(mixer, ctx, attention=stack.attention)
    return MIXERS.build(mixer, ctx, attention=stack.attention, ffn=_ffn(stack, ctx.dim), dropout=dropout,
                        cross_attention=cross)


def build_encoder(stack: StackConfig, *, dim: int, norm: str, dropout: float, max_len: int) -> Encoder:
    if stack.cross_attention is not None:  # the schema's stacks have the key on both sides: never silently unused
        raise ValueError("cross_attention is decoder-only (the encoder attends to nothing but its input); the "
                         "encoder stack sets it")
    layers = []
    for n in range(stack.layers):
        ctx = _context(stack, dim=dim, index=n, side="encoder", max_len=max_len)
        mixer_cfg = _layer_mixer(stack, n)
        mixer = _build_mixer(stack, mixer_cfg, ctx, dropout=dropout)
        pre_blocks = [PRE_BLOCKS.build(b, ctx, norm=norm, dropout=dropout) for b in stack.pre_blocks if b.applies_to(n)]
        ffn = _ffn(stack, dim) if mixer_cfg.layer_kind == "sequential" else None
        layers.append(EncoderLayer(mixer=mixer, ffn=ffn, dim=dim, norm=norm, dropout=dropout,
                                   pre_blocks=pre_blocks, kind=mixer_cfg.layer_kind))
    return Encoder(layers, dim=dim, final_norm=norm == "pre")


def build_decoder(stack: StackConfig, *, dim: int, norm: str, dropout: float, max_len: int) -> Decoder:
    if stack.pre_blocks:  # DecoderLayer has no pre-block slot (and no decoding cache for one)
        raise ValueError(f"pre_blocks are encoder-only; the decoder stack lists {[b.type for b in stack.pre_blocks]}")
    # (plan too, as an explicit cross_attention does not inherit it: banded suits window parts, not part-less
    # cross-attention, which would fall back to the dense plan instead of the fused kernel)
    cross_cfg = stack.cross_attention or stack.attention.model_copy(update={"parts": [], "plan": "auto"})
    layers = []
    for n in range(stack.layers):
        ctx = _context(stack, dim=dim, index=n, side="decoder", max_len=max_len)
        cross_ctx = BuildContext(**{**_context(stack, dim=dim, index=n, side="cross", max_len=max_len).__dict__,
                                    "heads": cross_cfg.heads})
        mixer_cfg = _layer_mixer(stack, n)
        kind = mixer_cfg.layer_kind
        held = kind == "parallel" and mixer_cfg.cross_branch  # MUSE: cross-attention is a branch of the block
        mixer = _build_mixer(stack, mixer_cfg, ctx, dropout=dropout,
                             cross=build_attention(cross_cfg, cross_ctx) if held else None)
        cross = None if held else build_attention(cross_cfg, cross_ctx)
        ffn = _ffn(stack, dim) if kind == "sequential" else None
        layers.append(DecoderLayer(self_mixer=mixer, cross_attention=cross, ffn=ffn, dim=dim, norm=norm,
                                   dropout=dropout, kind=kind))
    return Decoder(layers, dim=dim, final_norm=norm == "pre")


def build_seq2seq(config: Seq2SeqConfig, *, vocab_size: int, pad_id: int, tgt_vocab_size: int | None = None) -> Seq2Seq:
    """A translation model. With ``share_embeddings`` one table serves source and target."""
    if config.share_embeddings and tgt_vocab_size not in (None, vocab_size):
        raise ValueError("share_embeddings needs one joint vocabulary for source and target")
    tgt_vocab_size = tgt_vocab_size or vocab_size
    d = config.dim
    src_embed = TokenEmbedding(vocab_size=vocab_size, dim=d, pad_id=pad_id)
    tgt_embed = src_embed if config.share_embeddings else TokenEmbedding(vocab_size=tgt_vocab_size, dim=d,
                                                                         pad_id=pad_id)
    if config.positions == "sinusoidal":  # a fixed function: one module serves both sides
        src_positions = tgt_positions = SinusoidalPositions(d)
    else:  # learned: one table per side, as fairseq and OpenNMT-py keep them
        src_positions, tgt_positions = (LearnedPositions(max_positions=config.max_positions, dim=d, init_std=d ** -0.5)
                                        for _ in range(2))
    common = dict(dim=d, norm=config.norm, dropout=config.dropout, max_len=config.max_positions)
    return Seq2Seq(src_embed=src_embed, tgt_embed=tgt_embed, src_positions=src_positions, tgt_positions=tgt_positions,
                   encoder=build_encoder(config.encoder, **common), decoder=build_decoder(config.decoder, **common),
                   dim=d, vocab_size=tgt_vocab_size, pad_id=pad_id, dropout=config.dropout,
                   tie_output=config.tie_output, max_length=config.max_positions)


def build_tagger(config: TaggerConfig, *, vocab_size: int, num_chars: int, num_tags: int) -> Tagger:
    char_cnn = CharCNN(num_chars=num_chars, dim=config.char_dim, filters=config.char_filters,
                       width=config.char_width, layers=config.char_layers, train_pad_row=config.train_pad_rows)
    d = config.word_dim + (config.position_dim if config.position == "concat" else 0) + char_cnn.out_dim
    dufter = config.layer_style == "dufter"
    encoder = build_encoder(config.encoder, dim=d, norm="none" if dufter else config.norm,
                            dropout=config.dropout, max_len=config.max_len)
    if config.attention_init == "glorot_normal":
        glorot_normal_attention_(encoder)
    tagger = Tagger(vocab_size=vocab_size, word_dim=config.word_dim, char_cnn=char_cnn, position_mode=config.position,
                    position_dim=config.position_dim, max_len=config.max_len, encoder=encoder, num_tags=num_tags,
                    classifier_sees_embedding=config.classifier_sees_embedding, mask_padding=config.mask_padding,
                    train_pad_row=config.train_pad_rows)
    if config.dense_init == "glorot_uniform":
        keras_dense_init_(tagger)
    return tagger


def count_parameters(module: nn.Module) -> int:
    """Distinct trainable parameters (a shared/tied tensor counts once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters() if p.requires_grad}.values())
