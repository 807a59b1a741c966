"""train.device, train.precision and train.deterministic on the CPU: device names, batches moved, the legacy bf16
key, fp16's loss scaler (autocast + GradScaler, which torch also runs on the CPU) saved and resumed exactly,
deterministic algorithms switched on for a run and off after it, and device memory running out (torch's error,
raised here by hand) stopping a run with what to try."""

import dataclasses
import os
import re

import numpy as np
import pytest
import torch
import yaml

from sanlab.config import dump_config, validate
from sanlab.errors import ConfigError, TrainingError
from sanlab.runs import config_differences, train_run
from sanlab.training.checkpoint import load_state
from sanlab.training.device import (CUBLAS_DETERMINISTIC, MIN_LOSS_SCALE, check_loss_scale, describe_batch,
                                    deterministic_algorithms, resolve_device, to_device)
from training_fixtures import final_weights


def test_device_names(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="sees no CUDA device; use cpu or auto"):
        resolve_device("cuda:1")
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


# what torchrun, mpirun and srun set about a process's place (cleared before a test sets its own)
LAUNCHER_VARIABLES = ("WORLD_SIZE", "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _gpus(monkeypatch, count: int) -> None:
    """A machine whose torch sees ``count`` GPUs, and a process no launcher started."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_cuda_names_on_a_machine_with_two_gpus(monkeypatch):
    _gpus(monkeypatch, 2)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"device cuda:2: this process sees 2 CUDA device\(s\)$"):
        resolve_device("cuda:2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert resolve_device("cuda") == torch.device("cuda", 1)  # one GPU per torchrun process
    with pytest.raises(ConfigError, match=r"with 2 processes on this node \(LOCAL_WORLD_SIZE=2\): every one would "
                                          "use that one GPU"):
        resolve_device("cuda:0")


@pytest.mark.parametrize("variable", ["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"])
def test_cuda_is_the_gpu_of_the_processs_place_on_its_node_under_any_launcher(monkeypatch, variable):
    """torchrun sets LOCAL_RANK, srun SLURM_LOCALID, mpirun OMPI_COMM_WORLD_LOCAL_RANK: without the fallbacks every
    process that srun or mpirun started took cuda:0."""
    _gpus(monkeypatch, 4)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv(variable, "3")
    assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 3)
    monkeypatch.setenv(variable, "5")
    advice = "" if variable == "LOCAL_RANK" else r"; give each process one GPU \(srun --gpus-per-task=1: it takes " \
                                                 r"cuda:0\) or start at most 4 processes per node"
    with pytest.raises(ConfigError, match=rf"^device cuda:5 \(cuda, for the process with {variable}=5\): this process "
                                          rf"sees 4 CUDA device\(s\){advice}$"):
        resolve_device("cuda")
    if variable != "LOCAL_RANK":  # torchrun's variable counts first
        monkeypatch.setenv("LOCAL_RANK", "1")
        assert resolve_device("cuda") == torch.device("cuda", 1)
        monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv(variable, "²")  # a digit to str.isdigit(), not to int()
    with pytest.raises(ConfigError, match=f"{variable}=² in the environment: expected a whole number"):
        resolve_device("cuda")


def test_mpiruns_variable_counts_before_sruns(monkeypatch):
    """mpirun inside a Slurm job may start its processes through srun: they carry srun's variables too."""
    _gpus(monkeypatch, 4)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert resolve_device("cuda") == torch.device("cuda", 2)
    with pytest.raises(ConfigError, match=r"with 4 processes on this node \(OMPI_COMM_WORLD_LOCAL_SIZE=4\)"):
        resolve_device("cuda:2")


def _local_rank_beyond_the_gpus_is_refused(monkeypatch) -> None:
    """torchrun's LOCAL_RANK counts the node's GPUs, all visible to every process: one beyond them is a mistake."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"device cuda:1 \(cuda, for the process with LOCAL_RANK=1\): this process "
                                          r"sees 1 CUDA device\(s\)$"):
        resolve_device("cuda")


@pytest.mark.parametrize("world_size", [None, "1"])
def test_srun_and_mpirun_variables_name_no_gpu_outside_a_data_parallel_run(monkeypatch, world_size):
    """`srun -n2 sanlab evaluate ...` runs two independent processes: each one's SLURM_LOCALID is no GPU index (the
    task with SLURM_LOCALID=1 was refused "device cuda:1 ...: this machine has 1 CUDA device(s)"). torchrun's
    LOCAL_RANK keeps its meaning."""
    _gpus(monkeypatch, 1)
    if world_size is not None:
        monkeypatch.setenv("WORLD_SIZE", world_size)
    for variable in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.setenv(variable, "1")
        assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # the node's two GPUs, both visible
        assert resolve_device("cuda") == torch.device("cuda", 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.delenv(variable)
    _local_rank_beyond_the_gpus_is_refused(monkeypatch)


def test_a_process_that_sees_one_gpu_takes_it_under_srun_and_mpirun(monkeypatch):
    """`srun --gpus-per-task=1` (or a scheduler's CUDA_VISIBLE_DEVICES) shows each process its own GPU alone, as
    cuda:0, whatever its place on the node. torchrun shows every process all of the node's GPUs: LOCAL_RANK beyond
    them is a mistake, said."""
    _gpus(monkeypatch, 1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    for variable in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.setenv(variable, "1")
        assert resolve_device("cuda") == resolve_device("auto") == torch.device("cuda", 0)
        monkeypatch.delenv(variable)
    _local_rank_beyond_the_gpus_is_refused(monkeypatch)


def test_an_explicit_gpu_is_refused_only_where_processes_share_a_node(monkeypatch):
    _gpus(monkeypatch, 2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    # nothing says how many share the node (processes started by hand, one per machine): each may pick its GPU
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # 4 nodes of one process each
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    for variable in ("SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE"):
        monkeypatch.setenv(variable, "2")
        with pytest.raises(ConfigError, match=rf"with 2 processes on this node \({variable}=2\): every one would use "
                                              "that one GPU"):
            resolve_device("cuda:1")
        monkeypatch.delenv(variable)
    # srun without --ntasks-per-node, one task on each of two nodes (it was refused: "4 processes on this node")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")  # the batch job's request: the step's layout counts
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)")
    with pytest.raises(ConfigError, match=r"with 2 processes on this node \(SLURM_STEP_TASKS_PER_NODE=2\(x3\)\)"):
        resolve_device("cuda:1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2),3,1")  # uneven: the most on any node
    with pytest.raises(ConfigError, match=r"with 3 processes on a node \(SLURM_STEP_TASKS_PER_NODE=1\(x2\),3,1\)"):
        resolve_device("cuda:1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x")
    with pytest.raises(ConfigError, match=r"SLURM_STEP_TASKS_PER_NODE=2\(x in the environment: expected Slurm's "
                                          r"tasks per node, counts with repeats such as 2\(x3\),1"):
        resolve_device("cuda:1")
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    monkeypatch.setenv("WORLD_SIZE", "1")  # a batch job's setting, but one process: not distributed
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x3)")
    with pytest.raises(ConfigError, match=r"SLURM_NTASKS_PER_NODE=2\(x3\) in the environment: expected a whole number"):
        resolve_device("cuda:1")


def test_the_config_checks_the_device_spelling(tiny_translation):
    raw = yaml.safe_load(dump_config(tiny_translation()))
    raw["train"]["device"] = "gpu0"
    with pytest.raises(ConfigError, match="train.device"):
        validate(raw, source="t")


@dataclasses.dataclass(frozen=True)
class _Batch:
    src: torch.Tensor
    pairs: tuple
    tokens: int


def test_to_device_walks_a_batch_and_moves_nothing_on_the_cpu():
    batch = _Batch(torch.ones(2), (torch.zeros(1), {"x": torch.ones(1)}), tokens=3)
    moved = to_device(batch, torch.device("cpu"))
    assert moved.src is batch.src and moved.pairs[0] is batch.pairs[0] and moved.pairs[1]["x"] is batch.pairs[1]["x"]
    assert moved.tokens == 3
    on_meta = to_device(batch, torch.device("meta"))
    assert on_meta.src.is_meta and on_meta.pairs[1]["x"].is_meta and on_meta.tokens == 3


def test_legacy_bf16_key_is_a_precision_and_old_runs_compare_equal(tiny_translation):
    raw = yaml.safe_load(dump_config(tiny_translation()))
    assert raw["train"]["precision"] == "fp32" and "bf16" not in raw["train"]
    for legacy, precision in ((True, "bf16"), (False, "fp32")):
        old = {**raw, "train": {k: v for k, v in raw["train"].items() if k != "precision"} | {"bf16": legacy}}
        assert validate(old, source="old run").train.precision == precision
    old = {**raw, "train": {k: v for k, v in raw["train"].items() if k != "precision"} | {"bf16": False}}
    as_saved = yaml.safe_load(dump_config(validate(old, source="old run")))
    assert config_differences(as_saved, raw) == []  # a run written with bf16: false resumes under today's schema
    with pytest.raises(ConfigError, match="bf16: true and train.precision: fp16 disagree"):
        validate({**raw, "train": {**raw["train"], "bf16": True, "precision": "fp16"}}, source="t")


def test_fp16_resumes_bit_exact_with_its_loss_scale(tmp_path, tiny_translation):
    """Training 8 updates straight equals 4, a stop, and 4 more: the scaler's scale and growth counter are in
    the checkpoint and restored (a restarted scaler would count its growth interval from 0 again)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    train_run(tiny_translation(max_steps=8, valid_every=4, precision="fp16"), straight, quiet=True)
    train_run(tiny_translation(max_steps=4, valid_every=4, precision="fp16"), split, quiet=True)
    first = load_state(split / "checkpoints" / "step-00000004")
    assert set(first["scaler"]) >= {"scale", "_growth_tracker"}
    assert first["scaler"]["_growth_tracker"] == 4 - first["progress"]["skipped_updates"]  # good steps since growth
    train_run(tiny_translation(max_steps=8, valid_every=4, precision="fp16"), split, quiet=True)
    a, b = final_weights(straight), final_weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert load_state(split / "checkpoints" / "step-00000008")["scaler"] == \
        load_state(straight / "checkpoints" / "step-00000008")["scaler"]


def test_deterministic_algorithms_hold_inside_and_are_restored_after(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "recorded")  # so that monkeypatch restores whatever was there
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    users = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as a user may have set it before training (restored below)
    try:
        with deterministic_algorithms(True, torch.device("cpu")):
            assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
            assert not torch.backends.cudnn.benchmark
            assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # no cuBLAS on the CPU: the process is left as it is
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
        assert torch.backends.cudnn.benchmark
        with deterministic_algorithms(False, torch.device("cuda")):  # off: nothing is touched
            assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        with deterministic_algorithms(True, torch.device("cuda")) as warning:  # (a device object; nothing runs on it)
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_DETERMINISTIC and warning is None
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a user's own reproducible setting stays
        with deterministic_algorithms(True, torch.device("cuda")):
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # one cuBLAS does not reproduce with: refused
        with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG=:0:0 in the environment"):
            with deterministic_algorithms(True, torch.device("cuda")):
                pass
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # set after CUDA work began: said
        with deterministic_algorithms(True, torch.device("cuda")) as warning:
            assert "cuBLAS may keep the workspace it chose" in warning
        with pytest.raises(KeyError), deterministic_algorithms(True, torch.device("cpu")):
            raise KeyError("a failed run")
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.backends.cudnn.benchmark = users


def test_a_deterministic_run_says_so_resumes_switched_either_way_and_leaves_torch_as_it_was(tmp_path,
                                                                                          tiny_translation):
    """On the CPU the kernels are deterministic already: a deterministic run equals the default one bit for bit,
    and ``train.deterministic`` may change on resume (it chooses kernels, not the computation)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    train_run(tiny_translation(max_steps=4, deterministic=True), straight, quiet=True)
    assert ", deterministic algorithms" in (straight / "train.log").read_text()
    assert not torch.are_deterministic_algorithms_enabled()
    train_run(tiny_translation(max_steps=2), split, quiet=True)
    train_run(tiny_translation(max_steps=4, deterministic=True), split, quiet=True)
    a, b = final_weights(straight), final_weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_memory_running_out_stops_the_run_with_the_batch_and_what_to_try(tmp_path, tiny_translation, monkeypatch,
                                                                           capsys):
    """CUDA's out-of-memory error (raised here by the third update's forward pass) stops training with a message that
    names the update and its batch and says what to change; the update is not saved, the last checkpoint stays,
    and the run resumes from it. At validation the same, naming validation."""
    from sanlab.cli import main
    from sanlab.tasks.translation import TranslationTask

    real, calls, real_validate = TranslationTask.loss, [], TranslationTask.validate

    def loss(self, batch, *, model=None, **kw):
        if model is not None:  # a training update's forward (validation scores without the DDP-wrapped model)
            calls.append(batch)
            if len(calls) == 3:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                             "capacity of 79.19 GiB of which 1.06 GiB is free.\nmore torch advice")
        return real(self, batch, model=model, **kw)

    monkeypatch.setattr(TranslationTask, "loss", loss)
    run = tmp_path / "run"
    with pytest.raises(TrainingError) as caught:
        train_run(tiny_translation(max_steps=6, valid_every=2), run, quiet=True)
    message = str(caught.value)
    assert message.startswith("update 3 (epoch 0; a batch of ") and " pairs, " in message
    assert " tokens in the update) ran out of memory on cpu: CUDA out of memory. Tried to allocate 2.00 GiB. " \
           "GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free. Nothing of this update was saved; " \
           "last good checkpoint: " in message and "more torch advice" not in message
    assert "train.max_tokens for translation" in message and "train.accum_steps" in message
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-00000002"]
    monkeypatch.setattr(TranslationTask, "loss", real)
    train_run(tiny_translation(max_steps=6, valid_every=2), run, quiet=True)  # resumes from update 2
    assert "resumed from" in (run / "train.log").read_text()

    def validate(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")

    monkeypatch.setattr(TranslationTask, "validate", validate)
    config = tmp_path / "c.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=8, valid_every=2)))
    capsys.readouterr()
    assert main(["train", str(config), "--run", str(run), "--quiet"]) == 2
    assert "validation after update 8 ran out of memory on cpu: CUDA out of memory. Tried to allocate 8.00 GiB. " \
           "Update 8 was not saved" in capsys.readouterr().err
    # cuBLAS failing to allocate its workspace says so in a RuntimeError of its own: the same stop
    monkeypatch.setattr(TranslationTask, "validate", lambda self: (_ for _ in ()).throw(
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")))
    with pytest.raises(TrainingError, match="validation after update 8 ran out of memory on cpu: CUDA error: "
                                            "CUBLAS_STATUS_ALLOC_FAILED"):
        train_run(tiny_translation(max_steps=8, valid_every=2), run, quiet=True)
    def allocating(self):  # a real failure of torch's CPU allocator: more bytes than any address space
        torch.empty(2**60, dtype=torch.uint8)

    monkeypatch.setattr(TranslationTask, "validate", allocating)
    with pytest.raises(TrainingError, match="validation after update 8 ran out of memory on cpu: .*DefaultCPUAllocator: "
                                            "can't allocate memory"):
        train_run(tiny_translation(max_steps=8, valid_every=2), run, quiet=True)
    # the validation search running out: said as validation's, with training's advice (not translate's options)
    import sanlab.tasks.translation as translation

    monkeypatch.setattr(TranslationTask, "validate", real_validate)
    monkeypatch.setattr(translation, "beam_search", lambda *a, **k: (_ for _ in ()).throw(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB.")))
    with pytest.raises(TrainingError, match=r"^validation after update 8 ran out of memory on cpu \(decoding \d+ "
                                            r"sentences of up to \d+ subword tokens with beam 1\): CUDA out of "
                                            r"memory\. Tried to allocate 3\.00 GiB\. Update 8 was not saved"):
        train_run(tiny_translation(max_steps=8, valid_every=2), run, quiet=True)
    monkeypatch.setattr(TranslationTask, "validate", lambda self: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):  # any other error passes as it was
        train_run(tiny_translation(max_steps=8, valid_every=2), run, quiet=True)


def test_memory_running_out_in_the_optimizers_step_stops_the_run_too(tmp_path, tiny_translation, monkeypatch):
    """Adam makes its two moments a parameter at its first step: memory can run out there, after the batches fit."""
    from sanlab.training.loop import Trainer

    def step(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")

    monkeypatch.setattr(Trainer, "_step", step)
    with pytest.raises(TrainingError, match=r"^the optimizer's step of update 1 \(epoch 0; its state is made at the "
                                            r"first update\) ran out of memory on cpu: CUDA out of memory\. .* "
                                            r"Nothing of this update was saved"):
        train_run(tiny_translation(max_steps=2, valid_every=2), tmp_path / "run", quiet=True)


def test_a_batch_is_described_by_its_own_words_else_by_its_fields():
    from sanlab.tasks.translation import Batch, PendingBatch

    ids = torch.zeros(4, 7, dtype=torch.long)
    assert describe_batch(Batch(ids, ids[:, :5], ids[:, :5], tokens=1812)) == \
        "4 pairs padded to 7 source and 5 target positions, 1,812 target tokens"
    assert describe_batch(PendingBatch(indices=np.arange(3), tokens=20)) == "3 pairs, 20 target tokens"

    @dataclasses.dataclass
    class PluginBatch:  # a plugin task's batch without words of its own
        x: torch.Tensor
        rows: np.ndarray
        tokens: int
        flag: bool = True

    assert describe_batch(PluginBatch(torch.zeros(2, 3, 4), np.zeros(5), 12345)) == "x 2x3x4, rows 5, tokens 12,345"
    assert describe_batch([1, 2]) == "list"


def test_a_collapsed_loss_scale_stops_with_advice():
    scaler = torch.amp.GradScaler("cpu", init_scale=MIN_LOSS_SCALE / 2)
    with pytest.raises(TrainingError, match="fp16 loss scale fell below .* Try train.precision=bf16.*"
                                            r"or --set train\.clip_norm=1\.0$"):
        check_loss_scale(scaler, step=7, clip_norm=0.0)
    # a run that clips already is told to clip harder, not to clip at 1.0 (which may be looser than its own)
    with pytest.raises(TrainingError, match=r"or a smaller train\.clip_norm \(this run clips at 0\.1\)$"):
        check_loss_scale(scaler, step=7, clip_norm=0.1)
    check_loss_scale(torch.amp.GradScaler("cpu"), step=7, clip_norm=0.0)
    check_loss_scale(None, step=7, clip_norm=0.0)


def test_cli_device_options(tmp_path, tiny_translation, capsys, monkeypatch):
    from sanlab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    assert main(["train", str(recipe), "--device", "cpu", "--print-config"]) == 0
    assert "device: cpu" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--run", str(run), "--quiet"]) == 0
    assert re.fullmatch(r"done: step 2, best bleu [0-9.e+-]{1,6}\n", capsys.readouterr().out)  # .4g, not every digit
    assert main(["evaluate", "--run", str(run), "--split", "valid", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--split", "valid", "--device", "cuda"]) == 2
    assert "sees no CUDA device" in capsys.readouterr().err


def test_env_command_and_the_train_log_say_what_produced_a_result(tmp_path, tiny_translation, capsys):
    from sanlab.cli import main

    assert main(["env", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"torch: {torch.__version__}" in out and "device: cpu" in out
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=2, precision="bf16"), run, quiet=True)
    assert f"device cpu, precision bf16, torch {torch.__version__}" in (run / "train.log").read_text()


def test_a_checkpoint_written_on_a_gpu_resumes_on_the_cpu(tmp_path, tiny_translation):
    """state.pt of a CUDA run holds CUDA tensors (optimizer moments): it must load here, not count as damaged
    (which would skip it and delete it). Simulated by saving the state with CUDA location tags, and with the
    optimizer's groups saying fused, as AdamW is on CUDA (``build_optimizer``): the CPU resumes with it."""
    from torch import serialization

    from sanlab.files import read_json, write_json
    from sanlab.training.checkpoint import checksums

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=4, valid_every=2), run, quiet=True)
    newest = run / "checkpoints" / "step-00000004"
    state = load_state(newest)
    for group in state["optimizer"]["param_groups"]:
        assert group["fused"] is None  # on the CPU, torch's default
        group["fused"] = True
    real_tag = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save(state, newest / "state.pt")
    finally:
        serialization.location_tag = real_tag
    meta = read_json(newest / "meta.json")
    write_json(newest / "meta.json", {**meta, "sha256": {**meta["sha256"], **checksums(newest)}})
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(newest / "state.pt", weights_only=True)  # (the simulation holds: CUDA tags)
    train_run(tiny_translation(max_steps=6, valid_every=2), run, quiet=True)
    log = (run / "train.log").read_text()
    assert "resumed from" in log and "step 4" in log.split("resumed from")[-1].split("\n")[0]
    assert "damaged" not in log and newest.is_dir()


def test_an_fp16_overflow_skips_the_update_halves_the_scale_and_is_logged(tmp_path, tiny_translation, monkeypatch):
    from sanlab.training import loop
    from sanlab.training.logging import read_metrics

    real_update, calls, weights = loop.Trainer.update, [], {}

    def overflow_at_update_3(self, group):
        calls.append(1)
        if len(calls) == 3:  # one gradient becomes inf in this update's backward pass
            param = next(self.model.parameters())
            handle = param.register_hook(lambda g: torch.full_like(g, float("inf")))
            weights["before"] = {n: p.detach().clone() for n, p in self.model.named_parameters()}
            try:
                return real_update(self, group)
            finally:
                handle.remove()
                weights["after"] = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        return real_update(self, group)

    monkeypatch.setattr(loop.Trainer, "update", overflow_at_update_3)
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=4, valid_every=4, log_every=1, precision="fp16"), run, quiet=True)
    state = load_state(run / "checkpoints" / "step-00000004")
    assert state["progress"]["skipped_updates"] == 1 and state["progress"]["step"] == 4  # (a step all the same)
    train = [r for r in read_metrics(run) if r["split"] == "train"]
    assert [r["skipped_updates"] for r in train] == [0, 0, 1, 1]
    assert train[2]["loss_scale"] == train[1]["loss_scale"] / 2  # backed off
    assert all(torch.equal(weights["before"][n], weights["after"][n]) for n in weights["before"])  # not applied


def test_train_deterministic_sets_cublas_before_a_data_parallel_process_selects_its_gpu(tmp_path, tiny_translation,
                                                                                       monkeypatch):
    """A data-parallel process on CUDA selects its GPU (torch.cuda.set_device, in from_environment) before its NCCL
    group, which starts CUDA in the process: a cuBLAS setting made after that was reported in train.log as 'CUDA was
    in use in this process before train.deterministic set CUBLAS_WORKSPACE_CONFIG' in every such run, though no
    cuBLAS product had run. The setting comes first. (Seen on the CPU: the process group replaced.)"""
    import contextlib

    from sanlab.training import device as device_module, distributed

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "recorded")  # so that monkeypatch restores whatever was there
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen = []

    class Stop(Exception):
        pass

    @contextlib.contextmanager
    def from_environment(device):
        seen.append((device, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        raise Stop
        yield  # (a generator)

    monkeypatch.setattr(distributed, "from_environment", from_environment)
    monkeypatch.setattr(device_module, "resolve_device", lambda spec: torch.device("cuda", 0))
    with pytest.raises(Stop):
        train_run(tiny_translation(max_steps=2, deterministic=True), tmp_path / "run", quiet=True)
    assert seen == [(torch.device("cuda", 0), CUBLAS_DETERMINISTIC)]
    assert not torch.are_deterministic_algorithms_enabled()
