"""CUDA: what the CPU suite cannot show. Every test is marked ``gpu`` and skipped where torch sees no CUDA device
(CI and the project's machines); run them with ``pytest -m gpu`` or ``make gpu-check`` on a GPU machine.

    plans        every part's fast plans (sdpa, banded) == dense on CUDA, values and gradients, fp32 and bf16
    decoding     step-by-step decoding with the cache == the full forward on CUDA, for every decoder-capable part;
                 beam search syncs with the host once per step (the CPU tests count host reads; this counts syncs);
                 leaving the source side in place decodes exactly as copying the whole cache (fp32, bf16)
    training     a tiny run trains, validates and translates on cuda (bf16), and its fp16 run resumes bit-exact;
                 under deterministic algorithms every part, plan, mixer and pre-block runs and gives the same
                 gradients twice, and a Rel_Pos run resumes bit-exact; torch's own out-of-memory error stops a
                 run with its account;
                 an update never syncs with the host (fp32, bf16, fp16);
                 `analyze attention --device cuda` gives the map it gives on the CPU
    cpu == cuda  the same weights give the same outputs on both devices (fp32, tolerance of float reordering)
    nccl         where two GPUs exist, two processes (DDP over NCCL, accumulating under no_sync) train what one
                 process accumulating their batches trains
"""

import copy
import warnings

import pytest
import torch

from sanlab.attention import Attention, Positions, plans
from sanlab.attention.registry import PARTS
from sanlab.config import Seq2SeqConfig, StackConfig, validate
from sanlab.decoding.search import beam_search
from sanlab.errors import ConfigError
from sanlab.models.builders import build_seq2seq
from sanlab.registry import BuildContext
from sanlab.runs import train_run
from sanlab.training.compile import FAIL_SETTINGS, raised_limit
from sanlab.training.device import deterministic_algorithms
from tests_helpers import assert_close_in_norm, fast_plans, reorder_whole_caches, spy_plans, weight_grads
from training_fixtures import final_weights, make_tagging_config, no_model_dropout, train_processes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")]

DIM, HEADS, LENGTHS = 64, 4, (37, 20, 5)
CUDA = torch.device("cuda")
TOLERANCE = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
CASES = [pytest.param(cfg, id=f"{name}-{n}")
         for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]


def _attention(cfg, side: str, plan: str) -> Attention:
    torch.manual_seed(0)
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=64)
    return Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg, ctx)], plan=plan).to(CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("cfg", CASES)
def test_fast_plans_equal_dense_on_cuda(cfg, side, dtype):
    try:
        dense = _attention(cfg, side, "dense")
    except (ValueError, ConfigError) as err:  # no decoder form (the CPU contracts check the refusal)
        pytest.skip(str(err))
    fast = [plan for plan in fast_plans(dense) if plan != "flex"]  # flex: tests/gpu/test_flex_plans.py
    if not fast:
        pytest.skip("dense is this part's only plan")
    g = torch.Generator(device=CUDA).manual_seed(1)
    x = torch.randn(len(LENGTHS), max(LENGTHS), DIM, generator=g, device=CUDA)
    valid = torch.arange(max(LENGTHS), device=CUDA)[None] < torch.tensor(LENGTHS, device=CUDA)[:, None]
    positions = Positions.self_attention(valid, length=valid.shape[1], causal=side == "decoder", device=CUDA)
    probe = torch.randn(x.shape, generator=g, device=CUDA)
    results = []
    with spy_plans() as ran:
        for plan in ["dense", *fast]:
            attn = _attention(cfg, side, plan)
            attn.load_state_dict(dense.state_dict())
            xi = x.clone().requires_grad_(True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                out = attn(xi, positions=positions).output
            (out.float() * probe).sum().backward()
            results.append((plan, out.float(), xi.grad, weight_grads(attn)))
    assert ran == ["dense", *fast]  # each plan compared ran on CUDA: none fell back to dense
    _, want, want_grad, want_params = results[0]
    for plan, out, grad, params in results[1:]:
        torch.testing.assert_close(out, want, **TOLERANCE[dtype], msg=lambda m: f"{plan} values: {m}")
        torch.testing.assert_close(grad, want_grad, **TOLERANCE[dtype], msg=lambda m: f"{plan} gradients: {m}")
        # the weights' gradients too (a Gaussian's predictors get theirs through the plan), in norm: tests_helpers
        assert_close_in_norm(params, want_params, rtol=TOLERANCE[dtype]["rtol"], what=f"{plan} weight gradients")


def _seq2seq(parts: list) -> torch.nn.Module:
    torch.manual_seed(0)
    stack = StackConfig(layers=2, ffn_dim=128, attention={"heads": HEADS, "parts": parts})
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=128), decoder=stack,
                        max_positions=64)
    return build_seq2seq(cfg, vocab_size=50, pad_id=0).to(CUDA).eval()


@pytest.mark.parametrize("cfg", CASES)
def test_cached_decoding_equals_the_full_forward_on_cuda(cfg):
    try:
        model = _seq2seq([cfg.model_dump()])
    except (ValueError, ConfigError) as err:  # no decoder form
        pytest.skip(str(err))
    g = torch.Generator(device=CUDA).manual_seed(2)
    src, tgt = torch.randint(4, 50, (3, 11), generator=g, device=CUDA), torch.randint(4, 50, (3, 9), generator=g,
                                                                                        device=CUDA)
    src[1, 7:] = 0
    with torch.no_grad():
        full = model(src, tgt).log_softmax(-1)  # [b, i, V]
        cache = model.start_decoding(src)
        steps = []
        for t in range(tgt.shape[1]):
            log_probs, cache = model.decode_step(tgt[:, t:t + 1], cache)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-4, rtol=1e-4)


def _decoder_and_source(cfg) -> tuple[torch.nn.Module, torch.Tensor]:
    """A model whose decoder self-attention has ``cfg``'s part (None: plain), and 3 padded sources; skips a part
    without a decoder form."""
    try:
        model = _seq2seq([cfg.model_dump()] if cfg is not None else [])
    except (ValueError, ConfigError) as err:  # no decoder form
        pytest.skip(str(err))
    src = torch.randint(4, 50, (3, 11), generator=torch.Generator(device=CUDA).manual_seed(2), device=CUDA)
    src[1, 7:] = 0
    return model, src


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cfg", [pytest.param(None, id="vanilla"), *CASES])
def test_leaving_the_source_in_place_decodes_as_a_full_reorder_on_cuda(cfg, dtype, monkeypatch):
    """While no sentence leaves, beam search keeps the encoder output and the cross-attention keys and values
    where they are instead of copying them among a sentence's beams; exact only if those beams' rows hold the same
    bits, i.e. if cuBLAS gives equal rows for equal rows (under bf16 autocast too). The CPU test of every decoder
    form: tests/models/test_beam_shared_source.py."""
    model, src = _decoder_and_source(cfg)

    def decode():
        with torch.no_grad(), torch.autocast(CUDA.type, dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            return beam_search(model.decode_step, model.start_decoding(src), batch_size=3, beam_size=4, bos=2, eos=3,
                               pad=0, max_lengths=torch.tensor([6, 12, 9], device=CUDA), n_best=4)

    in_place = decode()
    reorder_whole_caches(monkeypatch)
    assert decode() == in_place


@pytest.mark.parametrize("cfg", [pytest.param(None, id="vanilla"), *CASES])
def test_beam_search_syncs_with_the_host_once_per_step_on_cuda(cfg):
    """``torch.cuda.set_sync_debug_mode`` warns at every sync; a marker per step splits them. What runs between two
    markers is one model step (CUDA-only plans included) and the search's bookkeeping: one sync in all."""
    model, src = _decoder_and_source(cfg)
    events: list = []

    def search(mark: bool):
        def step(tokens, state):
            if mark:
                events.append("step")
            return model.decode_step(tokens, state)
        return beam_search(step, model.start_decoding(src), batch_size=3, beam_size=4, bos=2, eos=3, pad=0,
                           max_lengths=torch.tensor([6, 12, 9], device=CUDA), n_best=4)

    with torch.no_grad():
        expected = search(mark=False)  # warm-up: first-call compilation (FlexAttention) may sync
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            events = caught  # the warnings and the step markers in one list, in order
            torch.cuda.set_sync_debug_mode("warn")
            try:
                found = search(mark=True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert found == expected
    marks = [k for k, e in enumerate(events) if e == "step"]
    syncs = [[e for e in events[a + 1:b] if "synchroniz" in str(getattr(e, "message", ""))]
             for a, b in zip(marks, marks[1:])]
    assert len(marks) >= 5 and all(len(s) == 1 for s in syncs), [len(s) for s in syncs]


@pytest.mark.parametrize("task,precision", [("translation", "fp32"), ("translation", "bf16"),
                                            ("translation", "fp16"), ("tagging", "bf16"), ("block", "bf16")])
def test_a_training_update_never_syncs_with_the_host_on_cuda(tmp_path, tiny_translation, monkeypatch, task,
                                                             precision):
    """Issue 24: the loss, gradient norm and fp16's overflow stay on the device (``training.interval``); the loop
    reads them every ``log_every`` updates; the tagger's batches bring their distinct words (``CharWords``).
    ``set_sync_debug_mode`` warns at every sync inside updates 3 to 8
    (the first two may sync while cuBLAS and the caching allocator warm up); the loop's reads come between.
    A Block encoder of two layers reads its automatic block length once per forward (a shape), not once per layer
    (tests/test_host_reads.py counts the reads on the CPU)."""
    from sanlab.training import loop

    update, syncs = loop.Trainer.update, []

    def watched(self, group):
        if self.progress.step < 2:
            return update(self, group)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return update(self, group)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs.append([str(w.message) for w in caught if "synchroniz" in str(w.message)])

    monkeypatch.setattr(loop.Trainer, "update", watched)
    make = {"translation": tiny_translation, "tagging": lambda **train: make_tagging_config(tmp_path, **train),
            "block": lambda **train: _with_block_encoder(tiny_translation(**train))}[task]
    train_run(make(max_steps=8, log_every=4, valid_every=8, device="cuda", precision=precision), tmp_path / "run",
              quiet=True)
    per_update = 1 if task == "block" else 0  # (one micro-batch an update)
    assert len(syncs) == 6 and all(len(s) == per_update for s in syncs), syncs


def _with_block_encoder(config):
    raw = config.model_dump(mode="json")
    raw["model"]["encoder"].update(layers=2, mixer={"type": "block"})
    return validate(raw, source="test")


def test_adamw_runs_fused_on_cuda_only():
    from sanlab.config import TrainConfig
    from sanlab.training.loop import build_optimizer

    model = _seq2seq([])
    assert build_optimizer(model, TrainConfig()).param_groups[0]["fused"] is True
    assert build_optimizer(model.cpu(), TrainConfig()).param_groups[0]["fused"] is None


def test_the_same_weights_give_the_same_outputs_on_cpu_and_cuda():
    model = _seq2seq([{"type": "window", "size": 5, "layers": [0]}]).cpu()
    src, tgt = torch.randint(4, 50, (2, 13)), torch.randint(4, 50, (2, 8))
    with torch.no_grad():
        on_cpu = model(src, tgt)
        on_cuda = model.to(CUDA)(src.to(CUDA), tgt.to(CUDA)).cpu()
    torch.testing.assert_close(on_cuda, on_cpu, atol=1e-4, rtol=1e-4)


def test_rel_pos_relation_tables_on_cuda_equal_the_cpus_distance_buckets(monkeypatch):
    """Rel_Pos takes its relation tables on CUDA (no atomic additions) and its distance buckets on the CPU
    (``rel_pos.relation_tables_pay``): the same weights give the same outputs and gradients on both."""
    from sanlab.attention.parts import rel_pos

    chosen = []
    pay = rel_pos.relation_tables_pay
    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: chosen.append(pay(**sizes)) or chosen[-1])
    model = _seq2seq([{"type": "rel_pos", "max_distance": 4}]).cpu()
    src, tgt = torch.randint(4, 50, (8, 13)), torch.randint(4, 50, (8, 10))
    src[1, 9:], tgt[2, 6:] = 0, 0

    def run(device):
        model.to(device).zero_grad()
        out = model(src.to(device), tgt.to(device))
        out.float().pow(2).mean().backward()
        return out.detach().cpu(), {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}

    (cpu_out, cpu_grads), on_cpu = run("cpu"), set(chosen)
    chosen.clear()
    cuda_out, cuda_grads = run(CUDA)
    assert on_cpu == {False} and set(chosen) == {True}  # buckets on the CPU, the tables on CUDA (8 x HEADS >= d)
    torch.testing.assert_close(cuda_out, cpu_out, atol=1e-4, rtol=1e-4)
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(cuda_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)
    # decoded step by step with the cache (8 sentences: the tables at every step too) == the full forward
    model.eval()
    src, tgt = src.to(CUDA), torch.randint(4, 50, (8, 10)).to(CUDA)  # (no padding: a decoder never feeds any)
    chosen.clear()
    with torch.no_grad():
        full = model(src, tgt).log_softmax(-1)  # [b, i, V]
        cache, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            log_probs, cache = model.decode_step(tgt[:, t:t + 1], cache)
            steps.append(log_probs)
    assert set(chosen) == {True}
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-4, rtol=1e-4)


def _mixer_forms() -> list:
    import importlib

    from sanlab.layers.mixers import MIXERS
    from sanlab.layers.pre_blocks import PRE_BLOCKS

    importlib.import_module("sanlab.config")  # imports every mixer and pre-block module: the registries are complete
    forms = [pytest.param({"mixer": {"type": name}}, id=f"mixer-{name}") for name in MIXERS.names()]
    forms.append(pytest.param({"mixer": {"type": "block", "block_mode": "reference"}}, id="mixer-block-reference"))
    return forms + [pytest.param({"pre_blocks": [{"type": name}]}, id=f"pre-block-{name}")
                    for name in PRE_BLOCKS.names()]


@pytest.mark.parametrize("encoder", _mixer_forms())
def test_every_mixer_and_pre_block_computes_on_cuda_what_it_computes_on_the_cpu(encoder):
    """Where a mixer takes another path on an accelerator (Block: both directions in one computation), the two
    paths meet here: the same weights, fp32, a padded batch, outputs and every weight gradient."""
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=128, attention={"heads": HEADS},
                                                                  **encoder),
                        decoder=StackConfig(layers=1, ffn_dim=128), max_positions=64)
    model = build_seq2seq(cfg, vocab_size=50, pad_id=0).eval()
    src, tgt = torch.randint(4, 50, (3, 37)), torch.randint(4, 50, (3, 9))
    for row, length in enumerate(LENGTHS):
        src[row, length:] = 0

    def outputs_and_grads(model, device):
        model.zero_grad()
        out = model(src.to(device), tgt.to(device))
        out.float().square().mean().backward()
        return out.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}

    on_cpu, cpu_grads = outputs_and_grads(model, torch.device("cpu"))
    on_cuda, cuda_grads = outputs_and_grads(model.to(CUDA), CUDA)
    torch.testing.assert_close(on_cuda, on_cpu, atol=1e-4, rtol=1e-4)
    # gradients below 1e-7 of the largest only have to be tiny on both devices: a bias a softmax ignores (every
    # attention's key bias, Block's summary bias) has a zero gradient, of which each device computes its own
    # rounding noise, and one that hardly matters (Block's f_bias, 2e-8 of the largest) is as close to it
    floor = 1e-7 * max(g.norm() for g in cpu_grads.values())
    zero = {n for n, g in cpu_grads.items() if g.norm() <= floor}
    assert all(cuda_grads[n].norm() <= 10 * floor for n in zero), sorted(zero)
    assert_close_in_norm({n: g for n, g in cuda_grads.items() if n not in zero},
                         {n: g for n, g in cpu_grads.items() if n not in zero},
                         rtol=1e-3, what="weight gradients on CUDA against the CPU's")


def test_block_takes_both_directions_at_once_on_cuda_as_precisely_as_one_after_the_other_in_bf16(monkeypatch):
    """Under CUDA's bf16 autocast the accelerator's path of Block is no further from a float64 run than the CPU's
    path run on CUDA (on the CPU, tests/layers/test_block_cnn.py checks both against the reference)."""
    from sanlab.layers import block_attention
    from sanlab.layers.block_attention import BiBloSA

    torch.manual_seed(0)
    core, r = BiBloSA(dim=128).to(CUDA), 5
    with torch.no_grad():
        for p in core.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randn(6, 40, 128, device=CUDA)
    valid = torch.arange(40, device=CUDA)[None] < torch.tensor([40, 33, 20, 7, 2, 1], device=CUDA)[:, None]

    def run(core, x, *, together, bf16):
        monkeypatch.setattr(block_attention, "directions_together", lambda device: together)
        core.zero_grad()
        x_in = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = core(x_in, valid, block_len=r)
        out.double().square().sum().backward()
        return [out.double(), x_in.grad.double(), torch.cat([p.grad.double().flatten() for p in core.parameters()])]

    truth = run(copy.deepcopy(core).double(), x.double(), together=False, bf16=False)
    together, apart = run(core, x, together=True, bf16=True), run(core, x, together=False, bf16=True)
    for name, t, a, b in zip(["output", "d/d input", "d/d the weights (all)"], truth, together, apart):
        error, apart_error = (a - t).norm() / t.norm(), (b - t).norm() / t.norm()
        assert error <= 1.1 * apart_error, f"{name}: {error:.3g} against {apart_error:.3g} one after the other"


def test_a_tiny_run_trains_validates_and_translates_on_cuda_in_bf16(tmp_path, tiny_translation):
    from sanlab.runs import evaluate_run

    run = tmp_path / "run"
    summary = train_run(tiny_translation(max_steps=12, valid_every=6, device="cuda", precision="bf16"), run,
                        quiet=True)
    assert summary["step"] == 12
    scores = evaluate_run(run, checkpoint="last", splits=["valid"], device="cuda")
    assert 0.0 <= scores["valid"]["bleu"] <= 100.0
    # analyze attention with the model on CUDA reads the same map as on the CPU (inputs moved, trace back)
    from sanlab.experiments import analyze

    sentence = (tmp_path / "train.src").read_text().splitlines()[0]
    maps = {device: (tmp_path / device).with_suffix(".csv") for device in ("cpu", "cuda")}
    for device in maps:
        analyze.attention_map(run, out=tmp_path / device, sentence=sentence, side="cross", layer=0, head=None,
                              checkpoint="last", target=sentence, device=device)
    import csv

    rows = {d: list(csv.reader(maps[d].read_text().splitlines())) for d in maps}
    assert rows["cpu"][0] == rows["cuda"][0] and [r[0] for r in rows["cpu"]] == [r[0] for r in rows["cuda"]]
    values = [[[float(x) for x in r[1:]] for r in rows[d][1:]] for d in maps]
    torch.testing.assert_close(torch.tensor(values[1]), torch.tensor(values[0]), atol=2e-3, rtol=0)


def test_a_real_out_of_memory_error_stops_the_run_with_its_account(tmp_path, tiny_translation, monkeypatch):
    """torch's own OutOfMemoryError on the device (an allocation far past any GPU's memory in the third update's
    loss): the run stops with its message (the update, torch's account of the memory, this process's peak, what
    to try), the CPU suite's simulated error checks the rest (tests/training/test_device.py)."""
    from sanlab.errors import TrainingError
    from sanlab.tasks.translation import TranslationTask

    real, calls = TranslationTask.loss, []

    def loss(self, batch, *, model=None, **kw):
        if model is not None:
            calls.append(1)
            if len(calls) == 3:
                torch.empty(2**50, dtype=torch.uint8, device=CUDA)  # a petabyte
        return real(self, batch, model=model, **kw)

    monkeypatch.setattr(TranslationTask, "loss", loss)
    with pytest.raises(TrainingError) as caught:
        train_run(tiny_translation(max_steps=6, valid_every=2, device="cuda"), tmp_path / "run", quiet=True)
    message = str(caught.value)
    assert message.startswith("update 3 (epoch 0; a batch of ") and "ran out of memory on cuda" in message
    assert "Tried to allocate" in message and "This process's peak:" in message and "GiB allocated" in message
    assert "train.accum_steps" in message


def test_fp16_on_cuda_resumes_bit_exact(tmp_path, tiny_translation):
    straight, split = tmp_path / "straight", tmp_path / "split"
    config = dict(valid_every=4, device="cuda", precision="fp16")
    train_run(tiny_translation(max_steps=8, **config), straight, quiet=True)
    train_run(tiny_translation(max_steps=4, **config), split, quiet=True)
    train_run(tiny_translation(max_steps=8, **config), split, quiet=True)
    a, b = final_weights(straight), final_weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _deterministic_plans(cfg) -> list[str]:
    """The plans that run ``cfg``'s part under deterministic algorithms on CUDA: every runnable one, less flex for a
    score part (``plans.choose`` refuses it: test_plan_choice.py)."""
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=2, side="encoder", max_len=512)
    try:
        parts = plans.StageParts.sort([PARTS.build(cfg, ctx)])
    except (ValueError, ConfigError):
        return []
    return [plan for plan in plans.runnable(parts, head_dim=DIM // HEADS) if not (plan == "flex" and parts.score)]


DETERMINISTIC_FORMS = [
    pytest.param({"attention": {"heads": HEADS}}, id="vanilla"),
    *(pytest.param({"attention": {"heads": HEADS, "parts": [cfg.model_dump()], "plan": plan}}, id=f"{name}-{n}-{plan}")
      for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())
      for plan in _deterministic_plans(cfg)),
    *_mixer_forms()]


@pytest.mark.parametrize("encoder", DETERMINISTIC_FORMS)
def test_deterministic_algorithms_give_the_same_gradients_twice_on_cuda(encoder):
    """``train.deterministic`` on CUDA (``training/device.deterministic_algorithms``): no operator of a part (through
    each plan that runs it there, ``_deterministic_plans``), mixer or pre-block refuses (torch raises where CUDA has no deterministic form; the CPU
    suite checks torch's documented list, tests/test_device_guard.py), and two identical forward and backward passes
    give the same gradients bit for bit. The sources are 300 tokens long: the fused kernels then split their keys,
    which is where they add in a varying order by default."""
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=128, **encoder),
                        decoder=StackConfig(layers=1, ffn_dim=128, attention={"heads": HEADS}), max_positions=512)
    model = build_seq2seq(cfg, vocab_size=50, pad_id=0).to(CUDA).eval()
    g = torch.Generator(device=CUDA).manual_seed(3)
    src, tgt = torch.randint(4, 50, (3, 300), generator=g, device=CUDA), torch.randint(4, 50, (3, 20), generator=g,
                                                                                         device=CUDA)
    src[1, 170:], src[2, 40:] = 0, 0

    def gradients():
        model.zero_grad(set_to_none=True)
        model(src, tgt).float().square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with deterministic_algorithms(True, CUDA), spy_plans() as ran:
        first, second = gradients(), gradients()
    plan = encoder.get("attention", {}).get("plan")
    assert plan is None or plan in ran, f"plan {plan} never ran under deterministic algorithms; these did: {set(ran)}"
    assert first and first.keys() == second.keys()
    differ = [n for n in first if not torch.equal(first[n], second[n])]
    assert not differ, f"gradients that differ between two identical passes: {differ[:5]}"


def test_a_deterministic_run_with_relative_positions_resumes_bit_exact_on_cuda(tmp_path, tiny_translation):
    """Rel_Pos looks its relation tables up (the lookup's backward sums many pairs into each table row) or, for one
    long sequence, scatters into distance buckets (atomic additions on CUDA by default): with ``train.deterministic``
    a run stopped and resumed equals the straight one bit for bit, dropout on."""
    def config(steps):
        raw = tiny_translation(max_steps=steps, valid_every=4, device="cuda", deterministic=True).model_dump(mode="json")
        for stack in ("encoder", "decoder"):
            raw["model"][stack]["attention"]["parts"] = [{"type": "rel_pos", "max_distance": 4}]
        return validate(raw, source="test")

    straight, split = tmp_path / "straight", tmp_path / "split"
    train_run(config(8), straight, quiet=True)
    train_run(config(4), split, quiet=True)
    train_run(config(8), split, quiet=True)
    a, b = final_weights(straight), final_weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ", deterministic algorithms" in (straight / "train.log").read_text()


def without_dropout(config):
    """The config with every dropout rate 0 (model, attention, weight dropout): compiled and eager then differ
    only by their arithmetic, on any torch version, whatever inductor does with random numbers."""
    def zero(tree):
        if isinstance(tree, dict):
            return {k: 0.0 if (k == "dropout" or k.endswith("_dropout")) and isinstance(v, float) else zero(v)
                    for k, v in tree.items()}
        return [zero(v) for v in tree] if isinstance(tree, list) else tree
    return validate(zero(config.model_dump(mode="json")), source="test")


@pytest.mark.parametrize("dropout", ["off", "on"])
def test_inductor_compiled_training_equals_eager_on_cuda(tmp_path, tiny_translation, dropout):
    """Inductor's CUDA kernels against eager with the same batches (train.pad_multiple 8 in both). With dropout
    off this is the arithmetic alone. With it on, inductor draws
    dropout masks from its own generator unless told to call eager's (``fallback_random``; pytorch/pytorch#141645),
    and the tiny run has dropout 0.2: without it the two runs differ by their masks, not by their arithmetic.
    That is most likely how the H200 run of 2026-11-27 failed (decoder.layers.0.cross_attention.k_proj.weight,
    the first name checked): CPU inductor gives the same picture, 4.4e-3 apart with its own masks, 6e-8 with eager's
    (results/gpu.md). The scheduler must also keep those calls in eager's order (``reorder_for_peak_memory``
    off, pytorch/pytorch#192635)."""
    import torch._dynamo
    import torch._inductor.config as inductor

    settings = {name: value for name, value in (("fallback_random", True), ("reorder_for_peak_memory", False))
                if hasattr(inductor, name)}
    torch._dynamo.reset()
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    config = dict(max_steps=6, valid_every=6, device="cuda")
    make = (lambda **train: without_dropout(tiny_translation(**train))) if dropout == "off" else tiny_translation
    train_run(make(pad_multiple=8, **config), eager, quiet=True)
    # training sets dynamo's recompile limit and fail-at-limit for its process: restored here, so that the other
    # GPU tests in this process (FlexAttention's compiled kernels) run with torch's own settings
    dynamo_keys = [k for k in (*raised_limit(), *FAIL_SETTINGS) if hasattr(torch._dynamo.config, k)]
    with inductor.patch(settings), torch._dynamo.config.patch({k: getattr(torch._dynamo.config, k) for k in dynamo_keys}):
        train_run(make(compile=True, **config), compiled, quiet=True)
    a, b = final_weights(eager), final_weights(compiled)
    worst = sorted(((b[k] - a[k]).abs().max().item(), k) for k in a)[-3:]  # named in a failure's message
    for name in a:
        if not name.endswith("k_proj.bias"):  # zero gradient in exact arithmetic: Adam amplifies kernel noise
            torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}\nlargest differences: {worst}")
    assert "torch.compile: compiled at update 1" in (compiled / "train.log").read_text()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=f"needs two CUDA devices (DDP over NCCL, --nproc 2); this "
                    f"machine has {torch.cuda.device_count()}. With one GPU a run has one process and no process "
                    f"group: nothing to reduce (training.distributed)")
def test_two_processes_over_nccl_train_what_one_accumulating_their_batches_trains(tmp_path, tiny_translation):
    """The CPU suite's gloo test (tests/training/test_distributed.py) over NCCL: each process on cuda:LOCAL_RANK,
    gradients all-reduced by NCCL, accumulation micro-batches under no_sync."""
    make, kw = no_model_dropout(tiny_translation), dict(max_steps=5, valid_every=5, eps=1.0, device="cuda")
    two = train_processes(tmp_path, make, "two", nproc=2, accum_steps=2, **kw)
    one = train_processes(tmp_path, make, "one", nproc=1, accum_steps=4, **kw)
    assert "distributed data parallel: 2 processes (nccl), 4 batches per update" in (tmp_path / "two" / "train.log"
                                                                                        ).read_text()
    for name in one:  # the same update up to the order of the floating-point sums (NCCL's, cuBLAS's)
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
