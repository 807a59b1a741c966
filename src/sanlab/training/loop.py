"""The training loop, task-agnostic: updates, validation, checkpoints, early stopping, resume.

A task supplies the model, the batches of each epoch, the loss of one batch and a validation
function (see ``TrainTask``). Everything needed to continue exactly where a run stopped —
weights, optimizer, step, epoch, position in the epoch's batch order, RNG states, early-stopping
counters — is in every checkpoint. Under torchrun the same loop runs in every process
(``training.distributed``): each update's batches are dealt out, DDP sums the gradients, and the
main process validates and checkpoints.

``--stop-after`` (``StopAfter``) ends a session at a wall-time limit, at an update boundary: a single process
checks the clock after every update (a ``time.monotonic()``, nothing on the device); under torchrun process 0
decides at every ``log_every``-th update, where the loop reads the device anyway, and broadcasts its decision (one
small collective per ``log_every`` updates, none in between), so that every process stops at the same update.
Unless a validation is due then anyway, the session saves a checkpoint without validating (``_save_to_resume``).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from sanlab.config import TrainConfig
from sanlab.errors import TrainingError
from sanlab.training.checkpoint import (RESUME_ONLY, CheckpointManager, DamagedCheckpoint, UnreadableCheckpoint,
                                       check_vocabulary, load_state, load_weights, read_meta, rng_state,
                                       set_rng_state)
from sanlab.training.compile import GraphWatch, compile_model, configure_dynamo
from sanlab.training.device import (Precision, check_loss_scale, clipping_advice, describe_batch, out_of_memory_stops,
                                    to_device)
from sanlab.training.diagnostics import collect_diagnostics
from sanlab.training.distributed import Distributed, RelayedCrash, RelayedError, failure_report
from sanlab.training.interval import DeviceInterval, Settled
from sanlab.training.logging import RunLogger, duration
from sanlab.training.schedule import learning_rate
from sanlab.training.stop_after import StopAfter, stopped_at


class TrainTask(Protocol):
    model: nn.Module
    metric: str              # the validation metric that selects the best checkpoints and counts early stopping:
    higher_is_better: bool   # the config's train.best_metric where set (``Task.best_metric``)

    def epoch_batches(self, epoch: int) -> Sequence[Any]: ...  # len() and slices; may build batches lazily
    def batch_tokens(self, batch: Any) -> int: ...
    def loss(self, batch: Any, *, model: nn.Module | None = None) -> Tensor: ...
    # ^ summed over the batch's tokens; computed with ``model`` (the DDP wrapper) when given
    def validate(self) -> dict[str, float]: ...
    # optional: ``vocabulary``, a digest of what the model's embeddings are tied to, kept in every checkpoint's
    # meta.json so that weights are never loaded over another vocabulary (checkpoint.check_vocabulary)


@dataclass
class SinceLog:
    """The updates since the last "train" record (its loss is their mean, its speed theirs)."""

    loss_sum: float = 0.0
    updates: int = 0
    tokens: int = 0
    seconds: float = 0.0
    gnorm_sum: float = 0.0   # their gradient norms before clipping (fp16: of the updates not skipped)
    gnorm_updates: int = 0


@dataclass
class Progress:
    """Counters that make a run resumable; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    position: int = 0        # batches of the current epoch already consumed
    best: float | None = None
    bad_validations: int = 0
    train_seconds: float = 0.0   # wall time spent in updates only (no validation, no data preparation)
    train_tokens: int = 0        # target tokens seen by those updates
    skipped_updates: int = 0     # fp16: updates whose gradients overflowed, skipped by the loss scaler

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("step", "epoch", "position", "best", "bad_validations",
                                              "train_seconds", "train_tokens", "skipped_updates")}

    def speed(self) -> dict[str, float]:
        """Training speed measured the same way for every model: updates and target tokens per second."""
        seconds = max(self.train_seconds, 1e-9)
        return {"steps_per_s": self.step / seconds, "tokens_per_s": self.train_tokens / seconds}


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or RMSprop over the trainable parameters. On CUDA, AdamW runs fused (one kernel for all parameters
    instead of torch's default multi-tensor loops: the update step is a visible share of a Transformer-Base
    update's time); on the CPU it keeps torch's default, which the runs trained so far used."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        fused = bool(params) and all(p.device.type == "cuda" for p in params)
        return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                                 weight_decay=config.weight_decay, **({"fused": True} if fused else {}))
    return torch.optim.RMSprop(params, lr=config.lr, alpha=config.rmsprop_alpha, eps=config.eps,
                               weight_decay=config.weight_decay)


class Trainer:
    def __init__(self, *, task: TrainTask, config: TrainConfig, run_dir: Path, logger: RunLogger,
                 dist: Distributed | None = None, stop_after: StopAfter | None = None):
        if config.best_metric not in (None, task.metric):  # (a training task that does not follow it)
            raise TrainingError(f"train.best_metric is {config.best_metric!r}, but the training task selects by "
                                f"{task.metric}: its trainer must take its metric from Task.best_metric(config)")
        self.task, self.config, self.run_dir, self.log = task, config, Path(run_dir), logger
        self.stop_after = stop_after  # this session's wall-time limit (--stop-after), not the run's
        self.dist = dist or Distributed.single()
        self.device = self.dist.device
        self.precision = Precision(config.precision, self.device)
        self.scaler = self.precision.scaler()
        # Every process learns whether the others' models reached their devices before DDP's set-up, a collective: one
        # whose GPU is full (another job on it) stopping alone left the others waiting there (torchrun ends them with
        # "connection closed"; a launch by hand waited for hours)
        with self.dist.all_or_none("starting"):
            with out_of_memory_stops(self.device, where=f"moving the model ({_parameters(task.model)}) to the device",
                                     advice="Free the device of other processes (nvidia-smi lists them), or train a "
                                            "smaller model."):
                self.model = task.model.to(self.device)  # in place: the task validates the same module
        self.train_model = self.dist.wrap(self.model, find_unused_parameters=config.find_unused_parameters)
        # the forward of training steps; validation and checkpoints use self.model, the same weights
        self.forward_model, self.graphs = self._compiled(config)
        self.optimizer = build_optimizer(self.model, config)
        self.checkpoints = CheckpointManager(self.run_dir, keep_best=config.keep_best, keep_last=config.keep_last,
                                             higher_is_better=task.higher_is_better, writer=self.dist.is_main)
        self.progress = Progress()
        self.interval = DeviceInterval(self.device, distributed=self.dist.enabled)  # read by settle
        self._since_log = SinceLog()  # what the next "train" record averages
        self.last_good: Path | None = None  # the newest checkpoint that loaded and validated, or this run saved

    # ------------------------------------------------------------------ resume
    def resume(self) -> bool:
        """Continue from the latest checkpoint, if there is one. Returns True if it did."""
        candidates = self.checkpoints.resume_candidates()
        latest, state = None, None
        # a process that fails here alone (no intact checkpoint on its node, another vocabulary) tells the others,
        # which would otherwise wait for it in the checks below; the same goes for the main process's clean-up after
        with self.dist.all_or_none("resuming"):
            if candidates:
                latest, state = self._load_newest_good(candidates)
        self._check_every_process_resumes_alike(latest)
        if latest is None:
            return False
        with self.dist.all_or_none("resuming"):
            reached = None
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and "scaler" in state:  # fp16's loss scale and its growth counter
                self.scaler.load_state_dict(state["scaler"])
            self.progress = Progress(**state["progress"])
            # the updates since the last "train" record (absent in older checkpoints): a checkpoint between two
            # records must not make the next record average fewer updates than the uninterrupted run's
            self._since_log = SinceLog(**state.get("since_log", {}))
            if "interval" in state:  # a --stop-after checkpoint: the updates since the device was last read
                self.interval.restore(state["interval"], main=self.dist.is_main)
            self._restore_rng(state)
            if self.dist.is_main:
                # written after `latest` by a run that then crashed, or damaged: training on replaces them
                self.checkpoints.discard_after(self.progress.step)
                self.checkpoints.discard_resume_only(but=latest)  # an older one left by a crash before pruning
                reached = self.log.truncate_after(self.progress.step)  # metrics of updates this run will now repeat
            redone = ("" if reached is None else f"; the interrupted session had logged updates up to {reached:,}: "
                      f"those after {self.progress.step:,} are done again and their records replaced")
            self.log.info(f"resumed from {latest} (step {self.progress.step}, epoch {self.progress.epoch}){redone}")
        self.last_good = latest
        return True

    def _check_every_process_resumes_alike(self, latest: Path | None) -> None:
        """Every process reads the checkpoints itself: one that saw another run directory (a node without the shared
        filesystem, or with a stale copy) would start from other weights and optimizer state, and DDP, which makes
        the weights equal only when it wraps the model, would not notice. Compared by the files' checksums (a copy
        trained apart has the same checkpoint names)."""
        mine = (None, None) if latest is None else (latest.name, read_meta(latest).get("sha256"))
        starts = self.dist.gather(mine)
        if any(start != starts[0] for start in starts):
            first_name, first_files = starts[0]
            found = "; ".join(f"rank {rank}: {name or 'no checkpoint'}"
                              + (" (other files)" if name == first_name and files != first_files else "")
                              for rank, (name, files) in enumerate(starts))
            raise TrainingError(f"the processes would resume from different checkpoints ({found}): every process must "
                                f"read the same run directory (on several nodes, a shared filesystem at the same path)")

    def _load_newest_good(self, candidates: list[Path]) -> tuple[Path, dict]:
        """Load the first checkpoint of ``candidates`` whose files are intact (weights into the model); a
        damaged one is named in the log and skipped. All damaged is an error naming each; one the system would
        not let us read (``UnreadableCheckpoint``) stops the resume there, before anything is deleted."""
        damaged = []
        for path in candidates:
            try:
                state = load_state(path)  # checked before the weights: the model is changed only by a good one
                # rows of another vocabulary (a tagger-vocab.json rebuilt from changed data) are refused, not trained on
                check_vocabulary(path, getattr(self.task, "vocabulary", None), run_dir=self.run_dir)
                load_weights(self.model, path)
                return path, state
            except UnreadableCheckpoint as err:  # perhaps intact: skipping it would delete it (discard_after)
                raise UnreadableCheckpoint(f"{err}: resuming stopped, nothing was deleted; make it readable (or move "
                                           f"{path.name} out of {path.parent}) and rerun") from None
            except DamagedCheckpoint as err:
                damaged.append(str(err))
                self.log.info(f"WARNING: skipping a damaged checkpoint: {err}")
        raise DamagedCheckpoint("no intact checkpoint to resume from: " + "; ".join(damaged)
                                + " (start again with --overwrite)")

    def _restore_rng(self, state: dict) -> None:
        per_process = state.get("rng_per_process")
        lost = None
        if per_process is not None and len(per_process) == self.dist.world_size:
            lost = set_rng_state(per_process[self.dist.rank], self.dist.device)
        elif self.dist.is_main:
            lost = set_rng_state(state["rng"], self.dist.device)
        if lost:
            self.log.info(f"WARNING: not an exact resume: {lost}")
        saved = state.get("processes", 1)
        if saved != self.dist.world_size:
            # Legal (the weights and optimizer are the same), but not the run it was: say so.
            self.log.info(f"WARNING: the checkpoint was written by {saved} process(es) and this run has "
                          f"{self.dist.world_size}: an update now takes {self.dist.world_size} x accum_steps batches "
                          f"instead of {saved} x, and the other processes' dropout streams are new")

    def _last_good_name(self) -> str:
        """The last good checkpoint as stop messages name it."""
        return str(self.last_good) if self.last_good is not None else "none yet (no checkpoint was written)"

    def _save(self, metrics: dict[str, float], rngs: list[dict], *, carried: Settled | None = None) -> None:
        """Checkpoint the current update; ``carried``: a --stop-after checkpoint's unread interval (no metrics)."""
        state = {"optimizer": self.optimizer.state_dict(), "progress": self.progress.as_dict(), "rng": rngs[0],
                 "processes": self.dist.world_size, "since_log": asdict(self._since_log)}
        if carried is not None:
            state["interval"] = {k: v for k, v in asdict(carried).items() if k != "bad"}
        if self.dist.enabled:
            state["rng_per_process"] = rngs
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        meta = {"step": self.progress.step, "epoch": self.progress.epoch, "position": self.progress.position,
                "metrics": metrics, "score": metrics.get(self.task.metric)}
        if getattr(self.task, "vocabulary", None) is not None:
            meta["vocabulary"] = self.task.vocabulary
        if carried is not None:
            meta[RESUME_ONLY] = True
        self.last_good = self.checkpoints.save(model=self.model, state=state, meta=meta)

    # ------------------------------------------------------------------ one update
    def update(self, group: list[Any]) -> tuple[Tensor, int]:
        """One optimizer step over ``group`` (the accumulated batches of all processes); this process's loss per
        token (a tensor on the device) and the group's tokens. Every process knows the whole group, so the
        normaliser needs no communication. Nothing here waits for the device: the loss and the gradient norm
        go to ``self.interval``, which the loop reads every ``log_every`` updates (``training.interval``)."""
        cfg, p = self.config, self.progress
        lr = learning_rate(p.step + 1, kind=cfg.schedule, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
                           warmup_init_lr=cfg.warmup_init_lr)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        tokens = sum(self.task.batch_tokens(b) for b in group)
        mine = self.dist.shard(group)
        # An epoch's last group may have fewer batches than processes: a process without one runs another's at
        # weight 0, so that it joins the gradient all-reduce and the update is the one 1 process would make.
        weight = 1.0 if mine else 0.0
        mine = mine or group[:1]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # summed on the device in float64 (the same sum as Python floats); a non-finite loss makes the sum so
        summed = torch.zeros((), dtype=torch.float64, device=self.device)
        for k, batch in enumerate(mine):
            with self.dist.no_sync(self.train_model, sync=k == len(mine) - 1), self._unused_parameters_hint(), \
                    self._out_of_memory_stops(batch, batches=len(mine), tokens=tokens):
                batch = to_device(batch, self.device)  # (its pinned copy can run out too)
                with self.precision.autocast():
                    loss = self._loss(batch) * (weight / tokens)
                # DDP averages gradients over processes; scaling by their number makes that a sum.
                scaled = loss * self.dist.world_size
                (scaled if self.scaler is None else self.scaler.scale(scaled)).backward()
            summed += loss.detach().double()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # true gradients for clipping; records an overflow
        grad_norm = self._clip()
        self.interval.add(p.step + 1, summed, grad_norm, overflow_skips=self.scaler is not None)
        try:
            with self._out_of_memory_stops(None, batches=len(mine), tokens=tokens):
                self._step()
        except RuntimeError as err:
            if "overflow" not in str(err):
                raise
            self.settle()  # an earlier update that went non-finite is the one to name (every process is here)
            # a step size beyond float32 (e.g. train.lr=1e39): torch refuses it where a smaller one gives NaN
            raise TrainingError(f"the update at step {p.step + 1} overflows float32 (learning rate {lr:g}); stopping "
                                f"without saving it. Last good checkpoint: {self._last_good_name()}. Try a lower "
                                "learning rate.") from None
        p.step += 1
        return summed, tokens

    def settle(self) -> Settled:
        """Read what the updates since the last read left on the device (``training.interval``) into the next
        "train" record; stop if one of them went non-finite, before anything validates or saves its weights."""
        p, settled = self.progress, self._read_interval()
        p.skipped_updates += settled.skipped
        self._since_log.loss_sum += settled.loss_sum
        self._since_log.updates += settled.updates
        self._since_log.gnorm_sum += settled.gnorm_sum
        self._since_log.gnorm_updates += settled.gnorm_updates
        return settled

    def _read_interval(self) -> Settled:
        """``settle``'s read and checks, without adding the interval to anything."""
        p, settled = self.progress, self.interval.settle()
        if settled.bad is not None:
            what, step, value = settled.bad
            # fp16's loss scale skips updates whose gradients overflow, but not a forward pass past fp16's range
            advice = ("Under fp16 a value past 65,504 in the forward pass gives this: try train.precision=bf16 "
                      "(fp32's range) first; else try" if self.scaler is not None else "Try")
            raise TrainingError(f"{what} is {value} at update {step} (epoch {p.epoch}); stopping without saving it. "
                                f"Last good checkpoint: {self._last_good_name()}. "
                                f"{advice} a lower learning rate, longer warm-up or {clipping_advice(self.config.clip_norm)}.")
        check_loss_scale(self.scaler, step=p.step, clip_norm=self.config.clip_norm)
        return settled

    def _log_train(self, bar) -> None:
        """The "train" record: the mean loss and the speed of the updates since the last one."""
        since, self._since_log = self._since_log, SinceLog()
        record = {"loss": since.loss_sum / max(since.updates, 1), "lr": self.optimizer.param_groups[0]["lr"],
                  "tokens_per_s": since.tokens / max(since.seconds, 1e-9)}
        if since.gnorm_updates:  # the mean gradient norm before clipping (fairseq's gnorm)
            record["gnorm"] = since.gnorm_sum / since.gnorm_updates
        if self.scaler is not None:
            record.update(loss_scale=self.scaler.get_scale(), skipped_updates=self.progress.skipped_updates)
        self.log.scalars("train", record, step=self.progress.step)
        gnorm = {"gnorm": f"{record['gnorm']:.3g}"} if "gnorm" in record else {}
        bar.set_postfix(step=self.progress.step, loss=f"{record['loss']:.3f}", **gnorm, lr=f"{record['lr']:.3g}",
                        tok_s=f"{record['tokens_per_s']:.0f}")

    def _compiled(self, config: TrainConfig) -> tuple[nn.Module, GraphWatch | None]:
        """The module training runs forward through: under ``train.compile`` the (DDP-wrapped) model compiled."""
        if not config.compile:
            return self.train_model, None
        if not configure_dynamo():
            self.log.info(f"WARNING: torch {torch.__version__} cannot stop at the recompile limit: past it, torch "
                          "runs the model eager (watch the 'recompiled' lines)")
        self.log.info(f"torch.compile: backend {config.compile_backend}, batch lengths padded to a multiple of "
                      f"{config.length_multiple} (never past the model's positions)")
        return (compile_model(self.train_model, backend=config.compile_backend, dynamic=config.compile_dynamic),
                GraphWatch(self.log.info))

    def _loss(self, batch: Any) -> Tensor:
        if self.graphs is None:
            return self.task.loss(batch, model=self.forward_model)
        return self.graphs.call(lambda: self.task.loss(batch, model=self.forward_model),
                                step=self.progress.step + 1, batch=batch)

    def _step(self) -> None:
        """The optimizer step; under fp16 through the loss scaler, which skips an update whose gradients
        overflowed (counted by ``self.interval``; the update still counts as a step, as in HF's Trainer) and
        adapts the scale."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()

    @contextlib.contextmanager
    def _unused_parameters_hint(self):
        """DDP's error for parameters without a gradient, said in our terms, with their names."""
        try:
            yield
        except RuntimeError as err:
            if "find_unused_parameters" not in str(err):
                raise
            indices = re.search(r"did not receive grad for rank \d+: ([\d ]+)", str(err))
            names = [n for n, q in self.model.named_parameters() if q.requires_grad]
            unused = [names[int(i)] for i in indices.group(1).split()] if indices else []
            raise TrainingError("some parameters get no gradient, which DDP must be told about: rerun with "
                                "--set train.find_unused_parameters=true"
                                + (f" (unused: {', '.join(unused)})" if unused else "")) from None

    def _out_of_memory_stops(self, batch: Any | None, *, batches: int, tokens: int):
        """A batch that does not fit the device (or, ``batch`` None, the optimizer's step: Adam makes its two
        moments a parameter at the first) stops the run with what to change. Nothing of the update is saved; a batch
        is never skipped or split behind the user's back: the run would no longer be the one its config and seed
        define, nor resume to the same parameters."""
        step, epoch = self.progress.step + 1, self.progress.epoch

        def where() -> str:  # said only when memory ran out: no work in every update
            return (f"update {step} (epoch {epoch}; a batch of {describe_batch(batch)}, one of {batches} in this "
                    f"process; {tokens:,} tokens in the update)" if batch is not None else
                    f"the optimizer's step of update {step} (epoch {epoch}; its state is made at the first update)")

        return out_of_memory_stops(self.device, where=where, advice=lambda: (
            f"Nothing of this update was saved; last good checkpoint: {self._last_good_name()}. Try smaller batches "
            "(train.max_tokens for translation, train.batch_size for tagging) with a larger train.accum_steps, "
            "which keeps the tokens per update (a new run: the batches follow them), train.precision=bf16, a "
            "lower data.max_len, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where torch reports much "
            "memory reserved but unallocated."))

    def _clip(self) -> Tensor:
        """The gradients' norm before clipping (a tensor: not read here)."""
        params = [q for q in self.model.parameters() if q.grad is not None]
        max_norm = self.config.clip_norm if self.config.clip_norm > 0 else float("inf")
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def _saved_step(self, *, validated: bool) -> int | None:
        """The update of the newest checkpoint; ``validated``: of the newest but a ``RESUME_ONLY`` one."""
        saved = self.checkpoints.validated() if validated else self.checkpoints.all()
        return saved[-1]["step"] if saved else None

    # ------------------------------------------------------------------ validation
    def _validate(self, *, on_schedule: bool = True) -> bool:
        """Validate, checkpoint, update early stopping (main process; the others take its counters).
        Returns True if training should stop.

        A validation off the ``valid_every`` schedule (the budget ends between two, or a session ends
        with unsaved updates) is checkpointed but leaves the early-stopping counters alone, so a run
        whose budget is raised on resume stops where one trained straight through would."""
        self.settle()  # the updates since the loop's last read (none, on the loop's own schedule)
        rngs = self.dist.gather(rng_state(self.device))
        self._check_weights_finite()
        self._on_main(lambda: self._validate_and_save(rngs, on_schedule=on_schedule), doing="validating")
        return self._patience_exhausted()

    def _save_to_resume(self) -> None:
        """The checkpoint of a session that ``--stop-after`` ends between two validations. It does not validate:
        none is due (at IWSLT or WMT scale one takes minutes), so it has no metrics and is never a best or last-N
        checkpoint (``checkpoint.RESUME_ONLY``). The updates since the device was last read are saved as read
        (``interval``), not added to the next "train" record's sums: those would then be rounded otherwise than
        in an uninterrupted run."""
        carried = self._read_interval()  # (a non-finite update stops here, unsaved, as before a validation)
        rngs = self.dist.gather(rng_state(self.device))
        self._check_weights_finite()
        self._on_main(lambda: self._save({}, rngs, carried=carried), doing="saving a checkpoint")

    def _on_main(self, write, *, doing: str) -> None:
        """Run ``write()`` (validating, saving) in the main process; the others wait for it and take its progress
        counters and the checkpoint it wrote, or stop with its failure."""
        failure = None
        if self.dist.is_main:
            try:
                write()
            except Exception as err:
                if not self.dist.enabled:
                    raise
                failure = err  # told to the others first: they wait for this process in the broadcast below
        if self.dist.enabled:
            # the checkpoint process 0 wrote travels too: the others' stop messages name it as the last good one
            shared = self.dist.broadcast({"failed": failure_report(failure)} if failure
                                         else {"progress": self.progress.as_dict(), "last_good": self.last_good})
            if failure is not None:
                raise failure
            if "failed" in shared:  # (any launcher: torchrun would end this process, others may not)
                report = shared["failed"]
                # process 0's crash (not a SanlabError) is a RelayedCrash, told from torchrun's account of process 0;
                # its sanlab error a RelayedError, which process 0 tells the launcher itself
                stopped, what = ((RelayedError, report["message"]) if report["sanlab"]
                                 else (RelayedCrash, f"{report['type']}: {report['message']}"))
                raise stopped(f"process 0 stopped while {doing} after update {self.progress.step}: {what}")
            for key, value in shared["progress"].items():  # in place: the loop holds a reference to it
                setattr(self.progress, key, value)
            self.last_good = shared["last_good"]

    def _validate_and_save(self, rngs: list[dict], *, on_schedule: bool) -> None:
        """The main process's part of ``_validate``: score, log, update the early-stopping counters, save."""
        p = self.progress
        with out_of_memory_stops(self.device, where=f"validation after update {p.step}", advice=(
                f"Update {p.step} was not saved; last good checkpoint: {self._last_good_name()}. Validation scores its "
                "loss 64 sentences at a time and decodes decode.batch_sentences at a time (a translation run): free "
                "the device of other processes, or lower decode.batch_sentences (a new run: validation picks the best "
                "checkpoint).")):
            metrics = self.task.validate()
        if not math.isfinite(metrics.get("loss", 0.0)):
            raise TrainingError(f"validation loss is {metrics['loss']} after update {p.step}: the model's outputs "
                                f"are not finite; stopping without saving it. Last good checkpoint: "
                                f"{self._last_good_name()}. Try a lower learning rate or gradient clipping.")
        rngs[0] = rng_state(self.device)  # after validation, as a single process always saved it
        score = metrics[self.task.metric]
        self.log.scalars("speed", p.speed(), step=p.step)
        improved = p.best is None or (score > p.best if self.task.higher_is_better else score < p.best)
        if on_schedule:
            p.best, p.bad_validations = (score, 0) if improved else (p.best, p.bad_validations + 1)
            verdict = (" (best)" if improved
                       else f" (best {self.task.metric} {p.best:.4g}, {p.bad_validations} without gain)")
        else:
            verdict = (" (" + ("a new best; " if improved else "")
                       + "off the validation schedule: not counted for early stopping)")
        self.log.scalars("valid", metrics, step=p.step)
        diagnostics = collect_diagnostics(self.model)  # e.g. learnable temperatures (training/diagnostics.py)
        if diagnostics:
            self.log.scalars("diagnostics", diagnostics, step=p.step)
        self.log.info(f"step {p.step} epoch {p.epoch}: "
                      + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) + verdict)
        self._save(metrics, rngs)

    def _check_weights_finite(self) -> None:
        """A finite loss and gradient can still give non-finite weights (an overflowing step); they must
        never be validated or saved. Every process holds the same weights, so all of them stop alike."""
        named = list(self.model.named_parameters())
        finite = torch.stack([torch.isfinite(q).all() for _, q in named]).tolist()  # one host read
        bad = [name for (name, _), ok in zip(named, finite) if not ok]
        if bad:
            raise TrainingError(f"weights are not finite after update {self.progress.step} ({len(bad)} tensors, "
                                f"e.g. {bad[0]}); stopping without saving them. Last good checkpoint: "
                                f"{self._last_good_name()}. Try a lower learning rate or gradient clipping.")

    def _patience_exhausted(self) -> bool:
        return self.config.patience > 0 and self.progress.bad_validations >= self.config.patience

    def check_batches(self, epoch: int, batches=None) -> None:
        """Every process needs a batch of the epoch's first update: a TrainingError where ``epoch`` has fewer
        batches than processes. (The start checks the first epoch too, where a new run's failure is taken back.)"""
        if batches is None:
            batches = self.task.epoch_batches(epoch)
        if len(batches) < self.dist.world_size:
            raise TrainingError(f"epoch {epoch} has {len(batches)} batch(es), fewer than the "
                                f"{self.dist.world_size} processes: use fewer processes or smaller batches")

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict:
        cfg, p = self.config, self.progress
        start = time.monotonic()
        stop = p.step >= cfg.max_steps or self._patience_exhausted()
        cut = False  # --stop-after's limit ended the session
        while not stop and p.epoch < cfg.max_epochs:
            batches = self.task.epoch_batches(p.epoch)
            bar = self.log.progress_bar(total=len(batches), initial=p.position, desc=f"epoch {p.epoch}")
            per_update = cfg.accum_steps * self.dist.world_size
            self.check_batches(p.epoch, batches)
            while p.position < len(batches) and not stop:
                group = batches[p.position: p.position + per_update]
                t0 = time.monotonic()
                _, tokens = self.update(group)
                p.train_tokens += tokens
                p.position += len(group)
                bar.update(len(group))
                stop = p.step >= cfg.max_steps
                log = p.step % cfg.log_every == 0
                validate = bool(cfg.valid_every) and (p.step % cfg.valid_every == 0 or stop)
                if log or validate or stop or p.position >= len(batches):  # (an error then names the right epoch)
                    self.settle()  # the host waits for the device here, so this update's time includes the wait
                seconds = time.monotonic() - t0
                p.train_seconds += seconds
                self._since_log.tokens += tokens
                self._since_log.seconds += seconds
                if log:
                    self._log_train(bar)
                if validate:
                    stop = self._validate(on_schedule=p.step % cfg.valid_every == 0) or stop
                seen = None if stop else self._limit_reached(logged=log)
                if seen is not None:  # when the limit was seen: the resume checkpoint below takes time too
                    cut = stop = True
                    limit_seen = (seen, time.monotonic() - start)
            bar.close()
            if p.position >= len(batches):
                p.epoch, p.position = p.epoch + 1, 0
                if not cfg.valid_every:
                    stop = self._validate() or stop  # (due at an epoch's end, the limit reached or not)
        cut = cut and not self._finished()  # the limit came with the run's last update: it ends as without it
        # A session that ends the run (not cut) counts a resume-only checkpoint as unsaved: one resumed from and
        # trained no further (its budget lowered to it) is validated and saved as in an uninterrupted run, not left
        # as the run's end beside a `last` and `best` of older weights
        unsaved = (self._saved_step(validated=not cut) != p.step) if self.dist.is_main else None
        if self.dist.broadcast(unsaved):  # never end a session with unsaved updates
            if cut:
                self._save_to_resume()
            else:
                self._validate(on_schedule=False)
        elapsed = time.monotonic() - start
        best = self._best_saved() if self.dist.is_main else p.best
        where = self._stopped_at(len(batches)) if cut else None
        since_start, training = limit_seen if cut else (None, None)
        why = self.stop_after.message(where, since_start=since_start, training=training) if cut else self._why_stopped()
        said = f"best {self.task.metric} {_shown(best)}" if best is not None else f"no {self.task.metric} validated yet"
        self.log.info(f"{'stopped' if cut else 'finished'} at step {p.step}, epoch {p.epoch}, {said} "
                      f"({duration(elapsed)} this session): {why}")
        # seconds: this session's wall time; train_seconds: the update time of the whole run, every session's;
        # bad_validations: whether patience stopped it (a grid tells from it whether a new budget goes on);
        # stopped_after: the --stop-after limit that ended this session before the run's end, else None; stopped_at:
        # where, in words (``stop_after.stopped_at``); command_seconds: when the limit was seen, the time since the
        # start it counts from; stopped_why: then, the line train.log ends with after "): " (the CLI prints it)
        return {"step": p.step, "epoch": p.epoch, "position": p.position, "best": best, "seconds": elapsed,
                "train_seconds": p.train_seconds, "bad_validations": p.bad_validations,
                "stopped_after": self.stop_after.text if cut else None, "stopped_at": where,
                "command_seconds": since_start, "stopped_why": why if cut else None}

    def _stopped_at(self, epoch_batches: int) -> str:
        """Where the limit stopped the session, against the bound that will end the run: of train.max_steps and
        train.max_epochs, the one ``fit`` reaches first (both at once: max_steps, as ``_why_stopped`` says), the
        epochs left counted at ``epoch_batches`` (the last epoch's) a piece."""
        cfg, p = self.config, self.progress
        per_update = cfg.accum_steps * self.dist.world_size
        epochs_left = (math.ceil((epoch_batches - p.position) / per_update)  # (position 0: the epoch is all ahead)
                       + (cfg.max_epochs - p.epoch - 1) * math.ceil(epoch_batches / per_update))
        by_epochs = p.epoch < cfg.max_epochs and p.step + epochs_left < cfg.max_steps
        return stopped_at(p.step, max_steps=cfg.max_steps, epochs=(p.epoch, cfg.max_epochs) if by_epochs else None)

    def _limit_reached(self, *, logged: bool) -> float | None:
        """Whether --stop-after's limit ends the session after this update: the seconds since the start it counts
        from, when it does, else None. One process: the clock, after every update. Under torchrun only at a "train"
        record's update (``logged``, the same on every process), where the loop reads the device anyway: process
        0's clock, broadcast, so that every process stops at the same update (at most ``log_every`` updates past
        the limit); the others say their own clock's time (only process 0 writes it)."""
        if self.stop_after is None or (self.dist.enabled and not logged):
            return None
        seen = self.stop_after.reached_after() if self.dist.is_main else None
        if not self.dist.enabled or not self.dist.broadcast(seen is not None if self.dist.is_main else None):
            return seen
        return seen if seen is not None else self.stop_after.since_start()

    def _finished(self) -> bool:
        """Whether a budget or early stopping has ended the run (a rerun trains no further)."""
        cfg, p = self.config, self.progress
        return p.step >= cfg.max_steps or p.epoch >= cfg.max_epochs or self._patience_exhausted()

    def _why_stopped(self) -> str:
        """Which budget ended training, in the words of its config key (a resumed run that had already stopped
        says so again, so the log of every session tells)."""
        cfg, p = self.config, self.progress
        if self._patience_exhausted():
            plural = "" if p.bad_validations == 1 else "s"
            return (f"stopped early, {p.bad_validations} validation{plural} without a better {self.task.metric} "
                    f"(train.patience = {cfg.patience})")
        if p.step >= cfg.max_steps:
            return f"reached train.max_steps = {cfg.max_steps}"
        return f"reached train.max_epochs = {cfg.max_epochs}"

    def _best_saved(self) -> float | None:
        """The best validation score of the saved checkpoints (the best ones are always kept), an
        off-schedule validation's included; ``progress.best`` is early stopping's reference, which
        leaves those out."""
        scores = [m["score"] for m in self.checkpoints.all() if m.get("score") is not None]
        if not scores:
            return self.progress.best
        return max(scores) if self.task.higher_is_better else min(scores)


def _parameters(model: nn.Module) -> str:
    """A model's size for a message: its parameter count and their bytes."""
    params = list(model.parameters())
    size = sum(q.numel() * q.element_size() for q in params)
    return f"{sum(q.numel() for q in params):,} parameters, {size / 2**20:,.1f} MiB"


def _shown(score: float | None) -> str:
    """A score as the validation lines show it (4 significant digits), not a float's every digit."""
    return "none" if score is None else f"{score:.4g}"
