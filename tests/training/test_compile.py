"""``train.compile`` and ``train.pad_multiple``: padding to a multiple is exact (padding is masked), the
compiled training forward equals the eager one, and recompiles are reported, never silently run eager."""

from pathlib import Path

import pytest
import torch

from sanlab.config import validate
from sanlab.data.batching import TokenBatchSampler, pad_batch
from sanlab.errors import TrainingError
from sanlab.models.builders import build_seq2seq
from sanlab.runs import train_run
from sanlab.compile_limits import LIMIT_SETTINGS, RECOMPILE_LIMIT
from sanlab.training.compile import FAIL_SETTINGS, GraphWatch, configure_dynamo, describe_shapes
from training_fixtures import final_weights

PAD = 0


def test_pad_batch_rounds_the_width_up_to_the_multiple():
    tokens, lengths = pad_batch([[5, 6, 7], [8]], PAD, multiple=8)
    assert tokens.shape == (2, 8) and lengths.tolist() == [3, 1]
    assert tokens[0, :3].tolist() == [5, 6, 7] and tokens[0, 3:].eq(PAD).all()
    assert pad_batch([[1] * 8], PAD, multiple=8)[0].shape == (1, 8)  # already a multiple: unchanged
    assert pad_batch([[1] * 3], PAD)[0].shape == (1, 3)


def test_a_tagging_batch_is_never_padded_past_the_models_positions():
    """Chunks are at most model.max_len words; rounding a 57-word chunk up to 64 would index position 63 of a
    60-position table (the shipped tagger recipe under train.compile crashed so)."""
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.tasks.tagging import TaggingVocab, encode_batch

    def chunk(n):
        return TaggedSentence(tuple(f"w{i}" for i in range(n)), ("X",) * n)

    vocab = TaggingVocab.build([chunk(60)], [chunk(60)], fraction=1.0, max_size=None)
    assert encode_batch(vocab, [chunk(57)], max_chars=4, multiple=8, max_len=60).words.shape == (1, 60)
    assert encode_batch(vocab, [chunk(50)], max_chars=4, multiple=8, max_len=60).words.shape == (1, 56)
    assert encode_batch(vocab, [chunk(57)], max_chars=4, multiple=8).words.shape == (1, 64)  # no cap given


def test_a_tagger_trains_with_pad_multiple_when_its_chunks_fill_max_len(tmp_path):
    from sanlab.data.synthetic import write_tagging_corpus

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 24, "dev": 8, "test": 8})
    config = validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                       "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1, "max_len": 5,
                                 "encoder": {"layers": 1}},
                       "train": {"batch_size": 8, "max_steps": 2, "pad_multiple": 8, "progress": False}}, source="test")
    assert train_run(config, tmp_path / "run", quiet=True)["step"] == 2


def test_the_token_budget_counts_the_rounded_length():
    lengths = [5] * 40
    plain = TokenBatchSampler(lengths, max_tokens=40, shuffle=False)
    rounded = TokenBatchSampler(lengths, max_tokens=40, shuffle=False, pad_multiple=8)
    assert {len(b) for b in plain.epoch_batches(0)} == {8}       # 8 x 5 tokens
    assert {len(b) for b in rounded.epoch_batches(0)} == {5}     # 5 x 8 padded tokens
    with pytest.raises(ValueError, match="pad_multiple"):
        TokenBatchSampler(lengths, max_tokens=40, pad_multiple=0)


@pytest.mark.parametrize("parts", [[], [{"type": "window", "size": 3}], [{"type": "rel_pos", "max_distance": 4}]],
                         ids=["vanilla", "1d-csan", "rel-pos"])
def test_padding_to_a_multiple_leaves_logits_loss_and_gradients_unchanged(parts):
    config = validate({"task": "translation",
                       "data": {"train": {"src": "x", "tgt": "y"}, "valid": {"src": "x", "tgt": "y"}},
                       "model": {"dim": 16, "dropout": 0.0, "encoder": {"layers": 2, "ffn_dim": 32,
                                                                        "attention": {"heads": 2, "parts": parts}},
                                 "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}}},
                      source="test")
    torch.manual_seed(0)
    model = build_seq2seq(config.model, vocab_size=30, pad_id=PAD)
    gen = torch.Generator().manual_seed(1)
    src = [torch.randint(1, 30, (n,), generator=gen).tolist() for n in (5, 3, 6)]
    tgt = [torch.randint(1, 30, (n,), generator=gen).tolist() for n in (4, 6, 2)]

    def run(multiple):
        model.zero_grad()
        s, t = pad_batch(src, PAD, multiple=multiple)[0], pad_batch(tgt, PAD, multiple=multiple)[0]
        logits = model(s, t)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=PAD, reduction="sum")
        loss.backward()
        return logits[:, :t.ne(PAD).sum(1).max()], loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, loss, grads = run(1)
    logits8, loss8, grads8 = run(8)
    real = pad_batch(tgt, PAD)[0].ne(PAD)
    torch.testing.assert_close(logits8[real], logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss8, loss, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads8[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_describe_shapes_names_tensors_and_sizes():
    from dataclasses import dataclass

    @dataclass
    class Pending:
        indices: list
        tokens: int

    @dataclass
    class Batch:
        src: torch.Tensor
        tokens: int

    assert describe_shapes(Batch(torch.zeros(4, 8, dtype=torch.long), 20)) == "src 4x8, tokens 20"
    assert describe_shapes(Pending([1, 2, 3], 17)) == "indices 3, tokens 17"


def _dynamo_settings() -> tuple[str, str | None]:
    """This torch's names for the recompile limit and for failing at it (renamed in torch 2.7; torch 2.5 has
    no setting to fail at it)."""
    import torch._dynamo

    known = torch._dynamo.config.get_config_copy()
    return (next(n for n in LIMIT_SETTINGS if n in known), next((n for n in FAIL_SETTINGS if n in known), None))


def test_configure_dynamo_raises_the_limit_and_says_whether_this_torch_can_stop_at_it():
    import torch._dynamo

    limit, fail = _dynamo_settings()
    names = [n for n in (limit, fail) if n]
    before = {n: getattr(torch._dynamo.config, n) for n in names}
    try:
        assert configure_dynamo() is (fail is not None)  # False: train.log warns that a run past it runs eager
        assert getattr(torch._dynamo.config, limit) >= RECOMPILE_LIMIT
        assert fail is None or getattr(torch._dynamo.config, fail) is True
    finally:
        for name, value in before.items():
            setattr(torch._dynamo.config, name, value)


def test_new_graphs_are_logged_and_the_recompile_limit_stops_the_run():
    import torch._dynamo

    limit, fail = _dynamo_settings()
    if fail is None:
        pytest.skip(f"torch {torch.__version__} has no setting to stop at the recompile limit")
    torch._dynamo.reset()
    lines = []
    watch = GraphWatch(lines.append)
    double = torch.compile(lambda x: x * 2, backend="eager")
    with torch._dynamo.config.patch({limit: 1, fail: True, "automatic_dynamic_shapes": False}):
        watch.call(lambda: double(torch.ones(3)), step=1, batch=torch.ones(3))
        watch.call(lambda: double(torch.ones(3)), step=2, batch=torch.ones(3))  # the same shape: no new graph
        assert len(lines) == 1 and "compiled at update 1 (batch: 3;" in lines[0]
        with pytest.raises(TrainingError, match="recompile limit .* at update 3 .*train.pad_multiple"):
            watch.call(lambda: double(torch.ones(5)), step=3, batch=torch.ones(5))
    torch._dynamo.reset()


def _compiled_vs_eager(tmp_path, config_for, backend):
    """Returns the compiled run's directory."""
    import torch._dynamo

    torch._dynamo.reset()
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    train_run(config_for(pad_multiple=8), eager, quiet=True)
    train_run(config_for(compile=True, compile_backend=backend), compiled, quiet=True)
    torch._dynamo.reset()
    a, b = final_weights(eager), final_weights(compiled)
    assert a.keys() == b.keys()
    tol = {"rtol": 0, "atol": 0} if backend == "eager" else {"rtol": 1e-4, "atol": 1e-5}
    for name in a:
        if backend != "eager" and name.endswith("k_proj.bias"):
            # zero gradient in exact arithmetic (a key bias shifts all of a query's scores alike); Adam turns
            # the rounding noise of two kernels into steps of full size, so these drift apart by design
            continue
        torch.testing.assert_close(b[name], a[name], msg=name, **tol)
    log = (compiled / "train.log").read_text()
    assert (f"torch.compile: backend {backend}, batch lengths padded to a multiple of 8 "
            "(never past the model's positions)") in log
    assert f"CPU thread(s) each, compiled ({backend})" in log
    assert "CPU thread(s) each, eager" in (eager / "train.log").read_text()
    assert "torch.compile: compiled at update 1" in log
    return compiled


def test_compiled_training_follows_eager_step_for_step(tmp_path, tiny_translation):
    """Dynamo's capture run eagerly (backend eager) trains to the same bits as eager with the same
    padding, dropout included: what compile adds around the model changes nothing. Compiling pads batches
    to 8 by default, so the batches would change if the run went on eager: that resume is refused."""
    from sanlab.errors import ConfigError

    compiled = _compiled_vs_eager(tmp_path, lambda **kw: tiny_translation(max_steps=3, valid_every=3, **kw), "eager")
    with pytest.raises(ConfigError, match="train.compile"):
        train_run(tiny_translation(max_steps=4, valid_every=3), compiled, quiet=True)


@pytest.mark.slow
def test_aot_compiled_translation_equals_eager(tmp_path, tiny_translation):
    """AOT autograd's traced forward and backward (what inductor compiles; inductor's own kernels are checked
    on CUDA by tests/gpu, a CPU inductor build of both graphs takes minutes here)."""
    _compiled_vs_eager(tmp_path, lambda **kw: tiny_translation(max_steps=3, valid_every=3, **kw), "aot_eager")


@pytest.mark.slow
def test_aot_compiled_tagger_equals_eager(tmp_path):
    from sanlab.data.synthetic import write_tagging_corpus

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 24, "dev": 8, "test": 8})

    def config_for(**train):
        return validate({"task": "tagging", "data": {"train": str(data / "train.conllu"),
                                                     "dev": str(data / "dev.conllu")},
                         "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                                   "encoder": {"layers": 1}},
                         "train": {"batch_size": 8, "max_epochs": 1, "patience": 0, "progress": False, "seed": 5,
                                   **train}}, source="test")

    _compiled_vs_eager(tmp_path, config_for, "aot_eager")


RECIPES = Path(__file__).resolve().parents[2] / "configs"
# The break by design, a size read from the data: Bi-BloSAN's block length is a function of the batch's
# longest sentence (the sqrt rule, spec B.5). (The tagger's character CNN runs once per distinct word, which
# the batch finds on the host: ``CharWords``.) Every other break is a defect, a host read elsewhere included.
# A break is (the first line of dynamo's reason, the function it broke in); a break by design is (a part of
# that line, that function).
# (read_longest: in Block.resolve_block_len; torch 2.5 says "Tensor.item", later ones "Tensor.item()")
BLOCK_LENGTH = ("Tensor.item", "read_longest")


def _breaks_by_design(recipe: str, task: str) -> set[tuple[str, str]]:
    return {BLOCK_LENGTH} if "block" in recipe else set()


def _is(found: tuple[str, str], by_design: tuple[str, str]) -> bool:
    return by_design[0] in found[0] and by_design[1] == found[1]


def _fewest_layers(stack: dict) -> int:
    """Enough layers of a stack that each per-layer configuration runs (dynamo's time grows with the layers it
    traces): all of them where a value is given per layer (DynamicConv's list of kernel widths), else past the
    highest layer any ``layers:`` list names, one more (a layer without it), else one."""
    if isinstance((stack.get("mixer") or {}).get("kernel_size"), list):
        return stack["layers"]
    def named(node) -> list[int]:
        if isinstance(node, dict):
            return [i for key, value in node.items() for i in (value if key == "layers" and isinstance(value, list)
                                                                   else named(value))]
        return [i for item in node for i in named(item)] if isinstance(node, list) else []

    indices = named(stack)
    return min(stack["layers"], max(indices) + 2) if indices else 1


@pytest.mark.slow
# every shipped recipe, and of the paper recipes (the same parts at other sizes) the MFU benchmark's model
@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")) + ["paper/wmt14-en-de-base.yaml"])
def test_every_recipe_compiles_without_unexpected_graph_breaks(recipe):
    """A graph break splits the compiled model, and the Python between the pieces runs at every step: the
    first MFU measurement on an H200 was 15% eager and 16% compiled, with 11 breaks in vanilla (a dataclass
    default_factory dynamo failed to call) and host reads of positions in the Dufter parts and learned
    position tables. torch._dynamo.explain on each shipped recipe, at a small width."""
    from sanlab.config import load_config
    from sanlab.models.builders import build_tagger
    from sanlab.models.tagger import CharWords

    config = load_config(RECIPES / recipe)
    if config.task == "translation":  # breaks depend on the code path, not on the sizes: a small width and the
        model = config.model.model_dump()  # fewest layers that still hold every per-layer configuration
        config = load_config(RECIPES / recipe, ["model.dim=32", *(f"model.{side}.layers={_fewest_layers(model[side])}"
                                                                  for side in ("encoder", "decoder"))])
    torch.manual_seed(0)
    if config.task == "translation":
        model = build_seq2seq(config.model, vocab_size=50, pad_id=0)
        src, tgt = torch.randint(4, 50, (3, 12)), torch.randint(4, 50, (3, 13))
        src[0, 9:], tgt[1, 10:] = 0, 0
        inputs, kwargs = (src, tgt), {}
    else:
        model = build_tagger(config.model, vocab_size=50, num_chars=20, num_tags=7)
        words, chars = torch.randint(2, 50, (3, 12)), torch.randint(2, 20, (3, 12, 6))
        words[0, 9:], chars[0, 9:] = 0, 0
        inputs = (words, chars)
        kwargs = {"char_words": CharWords.of(chars)}  # as the batches bring them (``encode_batch``)
    torch._dynamo.reset()
    found = torch._dynamo.explain(model)(*inputs, **kwargs)
    reasons = {(b.reason.splitlines()[0], b.user_stack[-1].name if b.user_stack else "?")
               for b in found.break_reasons}
    expected = _breaks_by_design(recipe, config.task)
    unexpected = {r for r in reasons if not any(_is(r, e) for e in expected)}
    assert not unexpected, f"{recipe}: {found.graph_break_count} graph breaks, unexpected: {sorted(unexpected)}"
    assert all(any(_is(r, e) for r in reasons) for e in expected), f"{recipe}: {sorted(reasons)} (a break by design went away: update the list)"


@pytest.mark.slow  # dynamo traces of a small model, a few seconds each
def test_a_compiled_model_compiles_a_bounded_number_of_graphs_over_varying_batch_shapes():
    """The bound docs/performance.md states: batches of Multi30k-like lengths padded to a multiple of 8, batch
    sizes varying (15 shapes in 16 batches), compile three graphs: the first static, then the batch size symbolic,
    then the lengths (torch's automatic dynamic shapes; the same three with inductor, measured with torch 2.13)."""
    import torch._dynamo

    from sanlab.training.compile import compile_model, compiled_graphs, dynamo_settings_restored

    config = validate({"task": "translation",
                       "data": {"train": {"src": "x", "tgt": "y"}, "valid": {"src": "x", "tgt": "y"}},
                       "model": {"dim": 16, "encoder": {"layers": 1, "ffn_dim": 32, "attention": {
                           "heads": 2, "parts": [{"type": "window", "size": 3}]}},
                                 "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}}}, source="test")
    torch.manual_seed(0)
    model = build_seq2seq(config.model, vocab_size=30, pad_id=PAD)
    shapes = [(5, 32, 40), (4, 40, 40), (6, 16, 24), (6, 40, 48), (3, 24, 32), (4, 16, 24), (6, 32, 32), (5, 24, 32),
              (5, 40, 40), (3, 32, 40), (3, 16, 24), (2, 40, 48), (2, 24, 32), (3, 16, 16), (2, 32, 32), (6, 16, 24)]
    gen = torch.Generator().manual_seed(1)
    torch._dynamo.reset()
    with dynamo_settings_restored(True):
        configure_dynamo()  # as train.compile runs: the limit raised, an error past it
        compiled, before = compile_model(model, backend="eager"), compiled_graphs()
        for b, src_len, tgt_len in shapes:
            src = pad_batch([torch.randint(1, 30, (src_len - n,), generator=gen).tolist() for n in range(b)],
                            PAD, multiple=8)[0]
            tgt = pad_batch([torch.randint(1, 30, (tgt_len - n,), generator=gen).tolist() for n in range(b)],
                            PAD, multiple=8)[0]
            compiled(src, tgt).sum().backward()
        graphs = compiled_graphs() - before
    torch._dynamo.reset()
    assert graphs == 3
