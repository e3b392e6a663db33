"""The training loop: epochs over seeded global batches, the two-tower's validation each epoch, early stopping,
then the best epoch's weights restored.

``recsys.job.run.fit`` assembles a run (data, model, sharding, batches, evaluator, the run's
:class:`~recsys.rundir.manager.CheckpointManager`), hands it to :class:`Trainer`, and then ranks
valid and test with the configured rankers (``recsys.job.run_stage``); tests and scripts call ``fit``
with a typed :class:`~recsys.config.Config`. The loop itself reads its own section (``trainer``), the schedule's
(``optim``) and the figure that picks the best epoch. Outputs (rank 0 only) in ``run_dir``::

    metrics.jsonl   one JSON object per log step and per epoch
    tb/             TensorBoard curves
    checkpoints/    step checkpoints and best/ (the best epoch's weights), written through the manager
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from tqdm import tqdm

from recsys.config import OptimConfig, TrainerConfig
from recsys.data.batch import Batch
from recsys.data.batches import TrainBatches
from recsys.data.dataset import RetrievalData
from recsys.distributed.env import DistEnv
from recsys.distributed.managed import managed_stats
from recsys.distributed.sharding import ShardedModel
from recsys.ranking.scoring import TRAINED_ROW
from recsys.ranking.sharded import Evaluator, SplitFigures
from recsys.rundir.checkpoint import TrainerState
from recsys.rundir.links import refuse_link
from recsys.rundir.manager import CheckpointManager
from recsys.rundir.outputs import MetricsLog
from recsys.rundir.preemption import Preempted, PreemptionHandler
from recsys.rundir.results import training_results
from recsys.utils.lr_schedule import LrSchedule

log = logging.getLogger(__name__)


def _global_mean(value: torch.Tensor, env: DistEnv) -> float:
    if env.world_size > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= env.world_size
    return float(value.item())


def _maybe_inject_fault(t: TrainerConfig, env: DistEnv, step: int) -> None:
    """Die like a preempted or OOM-killed worker, on the first attempt only (torchrun counts restarts)."""
    if t.fault_at_step and step == t.fault_at_step and env.rank == t.fault_rank:
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
            log.warning("fault injection: rank %d exits after step %d", env.rank, step)
            os._exit(13)


class TrainStep(NamedTuple):
    pipeline: TrainPipelineSparseDist | None  # detach() it before evaluating; None for the plain loop
    step: Callable[[Iterator[Batch]], torch.Tensor]  # one optimizer step on the next batch -> its detached loss


def make_train_step(pipeline: str, sharded: ShardedModel, env: DistEnv, precision: str = "fp32") -> TrainStep:
    """One training step of ``sharded``; the step raises StopIteration when the batches run out.

    ``pipeline``: trainer.pipeline, "none" or "sparse_dist" (torchrec's TrainPipelineSparseDist).
    ``precision``: trainer.precision; "bf16" runs the step's forward under bfloat16 autocast (AUTOCAST_DTYPES).
    """
    dmp, optimizer = sharded.module, sharded.optimizer
    if pipeline == "sparse_dist":
        train_pipeline = TrainPipelineSparseDist(dmp, optimizer, env.device, execute_all_batches=True)

        def piped_step(batches: Iterator[Batch]) -> torch.Tensor:
            with autocast_to(precision, env.device):  # progress runs forward and backward: both under it
                return train_pipeline.progress(batches)  # the task's second output: the detached loss

        return TrainStep(train_pipeline, piped_step)
    if pipeline != "none":
        raise ValueError(f"trainer.pipeline={pipeline!r}: expected 'none' or 'sparse_dist'")

    def step(batches: Iterator[Batch]) -> torch.Tensor:
        batch = next(batches).to(env.device, non_blocking=True)  # pinned on GPU: no host sync
        with autocast_to(precision, env.device):
            loss, _ = dmp(batch)
        loss.backward()  # the fused sparse optimizer updates the looked-up rows in here
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return TrainStep(None, step)


# trainer.precision (recsys.config.PRECISIONS) -> the autocast dtype of a training step (None: no autocast)
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 GEMMs natively: a CUDA device that supports bf16, or a CPU whose oneDNN
    has bf16 kernels (AVX512-BF16 / AMX); elsewhere bf16 autocast is emulated, far slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision: str, device: torch.device) -> str:
    """trainer.precision with "auto" resolved: "bf16" on a device with native bf16 GEMMs, else "fp32"."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def autocast_to(precision: str, device: torch.device) -> torch.autocast:
    """The autocast region of a training step at ``precision`` (disabled for fp32): the towers' and the loss's
    matmuls run in AUTOCAST_DTYPES[precision] with fp32 accumulation; the tables, their fused optimizer, the
    dense weights and Adam's state, the softmax and evaluation stay fp32 (recsys.model.task.masked_logits)."""
    dtype = AUTOCAST_DTYPES[precision]
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


class Trainer:
    """One run's loop over an assembled (data, sharded model, batches, evaluator): :meth:`fit` = resume, then
    :meth:`train_epoch` + :meth:`validate` until the epochs run out or early stopping, then the best
    epoch's weights restored. Which checkpoint it starts from and what it saves: ``checkpoints``.

    What a checkpoint holds besides the weights and optimizer is :meth:`state_dict`.
    """

    def __init__(
        self,
        config: TrainerConfig,
        run_dir: Path,
        env: DistEnv,
        data: RetrievalData,
        sharded: ShardedModel,
        *,
        optim: OptimConfig,
        valid_metric: str,
        checkpoints: CheckpointManager,
        batches: TrainBatches,
        evaluator: Evaluator,
        deadline: float | None = None,
        on_epoch: Callable[[int, float], bool] | None = None,
        keep_valid_users: bool = False,
    ) -> None:
        """``optim``: the learning-rate schedule's section; ``valid_metric``: the figure that picks the best epoch
        (eval.valid_metric). ``deadline``: a time.monotonic() after which no further epoch starts (a search's trial keeps its best so
        far); None: the epochs and early stopping alone decide. ``on_epoch(epoch, valid figure)``: called after each
        epoch's validation (one process: a search's trial); true stops the training there, as early stopping does.
        ``keep_valid_users``: ``best_valid_users`` holds (the valid users, the best epoch's figure of each) (a
        search's trial: recsys/tune/ compares trials user by user)."""
        self.tcfg, self.run_dir, self.env, self.data, self.sharded = config, run_dir, env, data, sharded
        self.valid_metric = valid_metric
        self.checkpoints, self.batches, self.evaluator = checkpoints, batches, evaluator
        self.deadline, self.on_epoch = deadline, on_epoch
        self.pruned = False  # stopped by ``on_epoch``
        self.keep_valid_users = keep_valid_users
        self.best_valid_users: tuple[np.ndarray, np.ndarray] | None = None
        self.two_tower = sharded.two_tower
        self.state = TrainerState(
            fingerprint=checkpoints.fingerprint,
            world_size=env.world_size,
            global_batch_size=self.tcfg.global_batch_size,
        )
        self.preemption = PreemptionHandler(
            self.tcfg.preemption_grace_s, rank=env.rank, world_size=env.world_size, device=env.device
        )
        self.metrics_log: MetricsLog | None = None
        # model.id_mapping=managed: the managed tables' counts (_log_managed)
        self.managed: dict[str, dict[str, int]] = {}
        # before resume: the base rates are the configured ones, not a checkpoint's decayed ones
        self.lr_schedule = LrSchedule(sharded.optimizer, optim.schedule, optim.schedule_epochs or self.tcfg.epochs)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's position and early-stopping state (``TrainerState``), as saved in each checkpoint."""
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = TrainerState(**state)

    def checkpoint(self, name: str | None = None, with_optimizer: bool = True) -> None:
        """Collective: the weights with the loop's state, the managed tables' counts so far among it."""
        stats = managed_stats(self.sharded.module, self.env.world_size)
        self.state.managed_counts = {t: {k: c[k] for k in ("admitted", "evicted")} for t, c in stats.items()}
        self.checkpoints.save(self.state, name=name, with_optimizer=with_optimizer)

    # ------------------------------------------------------------------ loop

    def fit(self, resume_from: Path | None) -> dict[str, Any]:
        """Resume from ``resume_from`` (``CheckpointManager.start``'s choice), train and validate each epoch,
        restore the best epoch's weights; returns what results.json holds of the training."""
        tcfg, env = self.tcfg, self.env
        self.state = self.checkpoints.resume(resume_from, self.state)
        precision = resolve_precision(tcfg.precision, env.device)
        if env.is_main and tcfg.precision == "auto":
            log.info(
                "trainer.precision=auto: %s (native bf16 GEMMs on %s: %s)",
                precision,
                env.device.type,
                precision == "bf16",
            )
        self.pipeline, self.train_step = make_train_step(tcfg.pipeline, self.sharded, env, precision)
        self.steps_per_epoch = min(len(self.batches), tcfg.max_steps_per_epoch or len(self.batches))
        self.checkpoints.tidy_logs(self.state.step if resume_from is not None else None)
        if env.is_main:
            refuse_link(self.run_dir / "metrics.jsonl")  # appended to where it is: never through a link
        self.metrics_log = MetricsLog(self.run_dir, enabled=env.is_main)
        try:
            self.preemption.install()  # SIGTERM / Ctrl-C now set a flag; checked after every step
            while not self.state.early_stopped and self.state.epoch < tcfg.epochs and not self._past_deadline():
                self.train_epoch()
                self.validate()
            self.preemption.restore()  # what follows is not resumable work: SIGTERM / Ctrl-C stop it at once again
            best = self.checkpoints.restore_best(self.state)
        finally:
            self.preemption.restore()
            self.metrics_log.close()
        return training_results(self.state, self.data, env.world_size, best, self.managed)

    @property
    def finished(self) -> bool:
        """Whether the training ran out its epochs or stopped early on valid (not at the deadline)."""
        return self.state.early_stopped or self.state.epoch >= self.tcfg.epochs

    def _past_deadline(self) -> bool:
        """Collective when several ranks train: whether the deadline has passed (rank 0's clock decides)."""
        if self.deadline is None:
            return False
        past = torch.tensor([int(time.monotonic() > self.deadline)], device=self.env.device)
        if self.env.world_size > 1:
            dist.broadcast(past, src=0)
        return bool(past.item())

    def train_epoch(self) -> None:
        """The rest of ``state.epoch`` from ``state.next_batch``: steps, loss logs, step checkpoints, SIGTERM."""
        state, tcfg, env = self.state, self.tcfg, self.env
        epoch, steps = state.epoch, self.steps_per_epoch
        self.sharded.module.train()
        progress = tqdm(
            total=steps,
            initial=state.next_batch,
            desc=f"epoch {epoch}",
            disable=not (env.is_main and tcfg.progress_bar),
            leave=False,
        )
        self._epoch_start = time.perf_counter()
        self._window = (time.perf_counter(), [], state.samples)
        remaining = islice(self.batches.epoch(epoch, start_batch=state.next_batch), max(0, steps - state.next_batch))
        for i in range(state.next_batch, steps):
            self.lr_schedule.apply(epoch + i / steps)
            try:
                loss = self.train_step(remaining)
            except StopIteration:
                break
            state.step += 1
            state.samples += int(self.batches.bounds[i + 1] - self.batches.bounds[i])
            state.next_batch = i + 1
            progress.update(1)
            self._window[1].append(loss)
            if state.step % tcfg.log_every_steps == 0 or i == steps - 1:
                progress.set_postfix(loss=f"{self._log_window(epoch):.4f}")
            if tcfg.checkpoint_every_steps and state.step % tcfg.checkpoint_every_steps == 0 and i < steps - 1:
                self._count_train_time()
                self.checkpoint()
            if self.preemption.should_stop(state.step):  # SIGTERM: this step is done, checkpoint it and stop
                self._count_train_time()
                self.checkpoint()
                raise Preempted(state.step, str(self.checkpoints.step_path(state.step)), self.preemption.signum)
            _maybe_inject_fault(self.tcfg, env, state.step)
        progress.close()
        self._count_train_time()
        if self.pipeline is not None:
            self.pipeline.detach()  # give the sharded modules their own forward back for evaluation

    def _count_train_time(self) -> None:
        now = time.perf_counter()
        self.state.train_seconds += now - self._epoch_start
        self._epoch_start = now

    def _log_window(self, epoch: int) -> float:
        """The mean loss over the steps since the last log line (all ranks), logged with samples/s."""
        state, env = self.state, self.env
        window_start, losses, window_samples = self._window
        mean_loss = _global_mean(torch.stack(losses).mean(), env)
        if not math.isfinite(mean_loss):  # the same on every rank: they stop together
            raise FloatingPointError(
                f"training loss is {mean_loss} at step {state.step} (epoch {epoch}); "
                "check pretrained tables and learning rates"
            )
        samples_per_s = (state.samples - window_samples) / max(time.perf_counter() - window_start, 1e-9)
        record = {"step": state.step, "epoch": epoch, "loss": mean_loss, "samples_per_s": samples_per_s}
        if self.lr_schedule.schedule != "constant":  # the factor on the configured rates (TensorBoard: train/lr_factor)
            record["lr_factor"] = self.lr_schedule.factor
        self.metrics_log.write(record)
        if env.is_main and not self.tcfg.progress_bar:
            log.info("epoch %d step %d: loss %.4f, %.0f samples/s", epoch, state.step, mean_loss, samples_per_s)
        self._window = (time.perf_counter(), [], state.samples)
        return mean_loss

    def _evaluate(self, split: str) -> SplitFigures:
        env, metric = self.env, self.valid_metric
        return self.evaluator.evaluate_users(
            self.two_tower, split, metric=metric if self.keep_valid_users else None, device=env.device,
            rank=env.rank, world_size=env.world_size,
        )  # fmt: skip

    def validate(self) -> None:
        """The epoch just trained: valid metric, best-weights checkpoint, early stopping, the epoch's checkpoint."""
        state, env, metric = self.state, self.env, self.valid_metric
        epoch, figures = state.epoch, None
        if self.data.valid_in_train:  # nothing held out: every epoch is "the best", the last one is tested
            score = state.best_score
            if env.is_main:
                log.info("epoch %d: trained on train + valid (no validation)", epoch)
        else:
            figures = self._evaluate("valid")
            valid = figures.metrics
            score = valid[TRAINED_ROW][metric]
            self.metrics_log.write(
                {"step": state.step, "epoch": epoch, **{f"valid/{k}": v for k, v in valid[TRAINED_ROW].items()}}
            )
            if env.is_main:
                log.info("epoch %d: valid %s = %.4f (best %.4f)", epoch, metric, score, max(state.best_score, score))
        self._log_managed(epoch)
        state.epoch, state.next_batch = epoch + 1, 0
        if self.data.valid_in_train or score > state.best_score:
            state.best_score, state.best_epoch, state.bad_epochs = score, epoch, 0
            if figures is not None and figures.users is not None:  # asked for: keep_valid_users
                self.best_valid_users = figures.users, figures.figures
            self.checkpoint("best", with_optimizer=False)
        else:
            state.bad_epochs += 1
            patience = self.tcfg.early_stopping_patience
            if patience and state.bad_epochs >= patience:
                if env.is_main:
                    log.info("early stop: no better valid %s for %d epochs", metric, state.bad_epochs)
                state.early_stopped = True
        if self.on_epoch is not None and not self.data.valid_in_train and self.on_epoch(epoch, score):
            state.early_stopped = self.pruned = True  # the search's pruner: this trial is behind the others here
        self.checkpoint()
        if self.preemption.should_stop():  # SIGTERM during validation: the epoch's checkpoint is written
            raise Preempted(state.step, str(self.checkpoints.step_path(state.step)), self.preemption.signum)

    def _log_managed(self, epoch: int) -> None:
        """model.id_mapping=managed: each managed table's rows, ids held, ids admitted and evicted so far."""
        stats = managed_stats(self.sharded.module, self.env.world_size)
        if not stats:
            return
        self.managed = stats
        self.metrics_log.write(
            {
                "step": self.state.step,
                "epoch": epoch,
                **{f"managed/{t}/{k}": v for t, counts in stats.items() for k, v in counts.items()},
            }
        )
        if self.env.is_main:
            log.info(
                "epoch %d: managed tables %s",
                epoch,
                "; ".join(
                    f"{t}: {c['ids']} ids in {c['rows']} rows, {c['admitted']} admitted, {c['evicted']} evicted"
                    for t, c in stats.items()
                ),
            )
