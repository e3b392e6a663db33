"""The training loop: epochs over seeded global batches, the two-tower's validation each epoch, early stopping,
then the best epoch's weights restored.

``recsys.run.fit`` assembles a run (data, model, sharding), hands it to :class:`Trainer`, and then ranks
valid and test with the configured rankers (``recsys.evaluation.run_stage``); tests and scripts call ``fit``
with a typed :class:`~recsys.config.Config`. Outputs (rank 0 only) in ``run_dir``::

    metrics.jsonl   one JSON object per log step and per epoch
    tb/             TensorBoard curves
    checkpoints/    step checkpoints and best/ (the best epoch's weights)
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

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from tqdm import tqdm

from recsys.checkpoint import (
    STATE_FILE,
    TrainerState,
    complete_checkpoints,
    has_optimizer_state,
    is_complete_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    read_trainer_state,
    save_checkpoint,
)  # fmt: skip
from recsys.config import Config, IdMapping, query_layout
from recsys.continuous import check_managed, check_slice_order, checkpoint_config, init_checkpoint, saved_world_size
from recsys.data.batch import Batch
from recsys.data.batches import FeatureBuilder, TrainBatches
from recsys.data.dataset import RetrievalData
from recsys.distributed.collectives import candidate_gather
from recsys.distributed.env import DistEnv
from recsys.distributed.managed import managed_stats
from recsys.distributed.sharding import ShardedModel
from recsys.evaluation.sharded import Evaluator
from recsys.fingerprint import config_fingerprint, weights_fingerprint
from recsys.lr_schedule import LrSchedule
from recsys.preemption import Preempted, PreemptionHandler
from recsys.refusals import MissingPath, RunRefused
from recsys.run_dir import completed_results, result_ks, set_aside_earlier_run, tidy_earlier_logs
from recsys.run_outputs import MetricsLog, format_results_table

log = logging.getLogger(__name__)


def _global_mean(value: torch.Tensor, env: DistEnv) -> float:
    if env.world_size > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= env.world_size
    return float(value.item())


def _maybe_inject_fault(cfg: Config, env: DistEnv, step: int) -> None:
    """Die like a preempted or OOM-killed worker, on the first attempt only (torchrun counts restarts)."""
    t = cfg.trainer
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


def resume_path(cfg: Config, ckpt_root: Path, env: DistEnv) -> Path | None:
    """The checkpoint trainer.resume names (None: start over), after setting aside an earlier run for resume=none."""
    resume = cfg.trainer.resume
    if resume == "none":
        if env.is_main:  # an earlier run's checkpoints and logs in this dir: set aside together, never deleted
            set_aside_earlier_run(ckpt_root.parent)
        return None
    if resume == "auto":
        partial = [p for p in ckpt_root.glob("step_*") if not is_complete_checkpoint(p)] if ckpt_root.is_dir() else []
        if partial and env.is_main:
            log.warning(
                "ignoring incomplete checkpoints (no %s): %s", STATE_FILE, ", ".join(sorted(p.name for p in partial))
            )
        return latest_checkpoint(ckpt_root)
    path = Path(resume)
    if not path.is_dir():
        raise MissingPath(f"trainer.resume={resume!r}: no such checkpoint dir")
    if is_complete_checkpoint(path) and not has_optimizer_state(path):  # best/: saved with_optimizer=False
        raise RunRefused(
            f"trainer.resume={resume!r}: {path} holds weights only (the best epoch's; no optimizer state or position "
            f"in the data), so a run cannot continue from it. Continue the run from a step checkpoint (trainer.resume="
            f"auto picks the newest), or start a new run from these weights: trainer.init_from={path} trainer.resume=none"
        )
    return path


def _best_weights(ckpt_root: Path, state: TrainerState) -> Path | None:
    """The checkpoint holding the best epoch's weights: ``best/``, else (deleted, damaged) the step checkpoint
    written at the end of that epoch, which holds the same weights; an error if neither is left."""
    if state.best_epoch < 0:
        return None
    best = ckpt_root / "best"
    if is_complete_checkpoint(best) and read_trainer_state(best).best_epoch == state.best_epoch:
        return best
    for path in reversed(complete_checkpoints(ckpt_root)):
        saved = read_trainer_state(path)
        if saved.epoch == state.best_epoch + 1 and saved.next_batch == 0:
            log.warning("%s is missing or damaged: testing the best epoch's weights from %s", best, path)
            return path
    raise MissingPath(
        f"{best}: missing or damaged, and no step checkpoint from the end of the best epoch ({state.best_epoch}) is "
        f"left: the weights to test are gone. Restore {best}, or retrain with trainer.resume=none "
        "(the old checkpoints are set aside, not deleted)"
    )


def _check_same_batches(saved: TrainerState, path: Path, global_batch_size: int) -> None:
    """Mid-epoch, the checkpoint's next batch counts batches of its own size: another size would resume at
    another example, training part of the epoch twice or skipping it. At an epoch end any size may follow."""
    if saved.next_batch > 0 and saved.global_batch_size and saved.global_batch_size != global_batch_size:
        raise RunRefused(
            f"trainer.global_batch_size={global_batch_size}: {path} was saved mid-epoch (epoch {saved.epoch}, batch "
            f"{saved.next_batch}) with trainer.global_batch_size={saved.global_batch_size}; with another size the rest "
            f"of the epoch would not be exactly its unseen examples. Resume with trainer.global_batch_size="
            f"{saved.global_batch_size} (the size may change at an epoch end), or start over with trainer.resume=none"
        )


class TrainOutcome(NamedTuple):
    results: dict[str, Any]  # train / dataset / checkpoint; a finished run's whole results.json when finished_before
    finished_before: bool  # the run dir held this run's results already (trainer.resume=auto): nothing was done


class Trainer:
    """One run's loop over an assembled (data, sharded model) pair: :meth:`fit` = resume, then
    :meth:`train_epoch` + :meth:`validate` until the epochs run out or early stopping, then the best
    epoch's weights restored (:meth:`restore_best`).

    What a checkpoint holds besides the weights and optimizer is :meth:`state_dict`.
    """

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        env: DistEnv,
        data: RetrievalData,
        sharded: ShardedModel,
        example_counts: list[int] | None = None,
    ) -> None:
        self.cfg, self.tcfg, self.run_dir, self.env, self.data, self.sharded = (
            cfg,
            cfg.trainer,
            run_dir,
            env,
            data,
            sharded,
        )
        sharded.task.gather_candidates = candidate_gather(env.rank, env.world_size)
        self.two_tower = sharded.two_tower
        self.ckpt_root = run_dir / "checkpoints"
        self.fingerprint = config_fingerprint(cfg)
        self.state = TrainerState(
            fingerprint=self.fingerprint, world_size=env.world_size, global_batch_size=self.tcfg.global_batch_size
        )
        self.config_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))
        self.example_counts = example_counts  # every rank's training examples, when each holds its own users only
        self.preemption = PreemptionHandler(
            self.tcfg.preemption_grace_s, rank=env.rank, world_size=env.world_size, device=env.device
        )
        self.metrics_log: MetricsLog | None = None
        # model.id_mapping=managed: the managed tables' counts (_log_managed)
        self.managed: dict[str, dict[str, int]] = {}
        # before resume(): the base rates are the configured ones, not a checkpoint's decayed ones
        self.lr_schedule = LrSchedule(
            sharded.optimizer, cfg.optim.schedule, cfg.optim.schedule_epochs or self.tcfg.epochs
        )

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The loop's position and early-stopping state (``TrainerState``), as saved in each checkpoint."""
        return asdict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = TrainerState(**state)

    def checkpoint(self, name: str | None = None, with_optimizer: bool = True) -> None:
        save_checkpoint(
            self.sharded,
            self.state,
            root=self.ckpt_root,
            env=self.env,
            name=name,
            keep_last=self.tcfg.keep_last_checkpoints,
            with_optimizer=with_optimizer,
            config_yaml=self.config_yaml,
        )

    def resume(self, resume_from: Path | None) -> None:
        """Load ``resume_from`` (``resume_path``'s choice), or with None trainer.init_from's weights if set."""
        if resume_from is None:
            if self.tcfg.init_from:
                self._init_from(Path(self.tcfg.init_from))
            return None
        saved_state = read_trainer_state(resume_from)
        saved_cfg = checkpoint_config(resume_from)
        if saved_cfg is not None:  # another zch_size / policy / world size, named before the fingerprint differs
            check_managed(
                "trainer.resume", resume_from, saved_cfg, self.cfg, saved_world_size(saved_state), self.env.world_size
            )
        if saved_state.fingerprint != self.fingerprint:  # before loading: other shapes would fail inside DCP
            raise RunRefused(
                f"{resume_from}: saved for another data/model config (fingerprint {saved_state.fingerprint}, "
                f"now {self.fingerprint}); use trainer.resume=none or another run_name"
            )
        _check_same_batches(saved_state, resume_from, self.tcfg.global_batch_size)
        self.load_state_dict(asdict(load_checkpoint(self.sharded, resume_from, env=self.env)))
        state, env = self.state, self.env
        state.global_batch_size = self.tcfg.global_batch_size
        if env.is_main:
            log.info(
                "resumed from %s: step %d, epoch %d, batch %d", resume_from, state.step, state.epoch, state.next_batch
            )
        if self.cfg.data.shard_by_user and state.next_batch > 0 and state.world_size != env.world_size and env.is_main:
            log.warning(
                "data.shard_by_user: resuming mid-epoch on %d ranks, saved on %d: the users' split across ranks "
                "changed, so the rest of epoch %d is not exactly the remainder of the interrupted one",
                env.world_size,
                state.world_size,
                state.epoch,
            )
        state.world_size = env.world_size

    def _init_from(self, path: Path) -> None:
        """trainer.init_from: another checkpoint's weights (a run dir: its newest step checkpoint), with
        trainer.init_optimizer its optimizer state too; step, data position and RNG stay new
        (recsys/continuous.py)."""
        path = init_checkpoint(path)
        state, saved_cfg = read_trainer_state(path), checkpoint_config(path)
        if saved_cfg is not None:
            check_managed("trainer.init_from", path, saved_cfg, self.cfg, saved_world_size(state), self.env.world_size)
        # the run's fingerprint, or (data.slices) the same model on another slice of the same log
        same = state.fingerprint == self.fingerprint or (
            saved_cfg is not None and weights_fingerprint(saved_cfg) == weights_fingerprint(self.cfg)
        )
        if not same:
            raise RunRefused(
                f"trainer.init_from={str(path)!r}: weights of another data/model config (fingerprint "
                f"{state.fingerprint}, now {self.fingerprint})"
            )
        if saved_cfg is not None:
            check_slice_order(path, saved_cfg, self.cfg, self.data)
        with_optimizer = self.tcfg.init_optimizer
        if with_optimizer and not has_optimizer_state(path):
            raise RunRefused(
                f"trainer.init_optimizer=true: {path} holds weights only (no optimizer state); name a step checkpoint "
                "or the run dir, or set trainer.init_optimizer=false"
            )
        rng = torch.get_rng_state()
        load_checkpoint(self.sharded, path, env=self.env, with_optimizer=with_optimizer)
        torch.set_rng_state(rng)  # this run's seed, not the source run's RNG
        if self.env.is_main:
            log.info(
                "trainer.init_from: starting from the weights%s in %s",
                " and optimizer state" if with_optimizer else "",
                path,
            )

    # ------------------------------------------------------------------ loop

    def fit(self) -> TrainOutcome:
        """Resume, train and validate each epoch, restore the best epoch's weights."""
        tcfg, env, data = self.tcfg, self.env, self.data
        resumed = resume_path(self.cfg, self.ckpt_root, env)
        done = (
            completed_results(self.run_dir, resumed, self.fingerprint, tcfg.epochs) if tcfg.resume == "auto" else None
        )
        if done is not None:  # a finished run is not trained again (the same answer on every rank: same files)
            if env.is_main:
                print(format_results_table(done, result_ks(done)), flush=True)
            return TrainOutcome(done, True)
        self.resume(resumed)
        self.batches = TrainBatches(
            data,
            history_length=self.cfg.data.history_length,
            global_batch_size=tcfg.global_batch_size,
            num_uniform_negatives=self.cfg.model.num_uniform_negatives,
            seed=tcfg.seed,
            query_history=self.cfg.data.query_history,
            history_dropout=self.cfg.data.history_dropout,
            **query_layout(self.cfg),
            rank=env.rank,
            world_size=env.world_size,
            pin_memory=env.device.type == "cuda",  # built (and pinned) on the prefetch thread, off the step
            rank_example_counts=self.example_counts,
            equal_shares=self.cfg.model.id_mapping == IdMapping.managed,
        )
        self.evaluator = Evaluator(
            data,
            FeatureBuilder(data, self.cfg.data.history_length, **query_layout(self.cfg)),
            ks=self.cfg.eval.ks,
            batch_size=self.cfg.eval.batch_size,
            chunk_size=self.cfg.eval.chunk_size,
            per_rank_users=self.cfg.data.shard_by_user,
        )
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
        if env.is_main:  # a crashed attempt's records: after the checkpoint, or all of them with none to resume
            tidy_earlier_logs(self.run_dir, self.state.step if resumed is not None else None)
        self.metrics_log = MetricsLog(self.run_dir, enabled=env.is_main)
        try:
            self.preemption.install()  # SIGTERM now sets a flag; checked after every step
            while not self.state.early_stopped and self.state.epoch < tcfg.epochs:
                self.train_epoch()
                self.validate()
            self.preemption.restore()  # what follows is not resumable work: SIGTERM stops it at once again
            best = self.restore_best()
        finally:
            self.preemption.restore()
            self.metrics_log.close()
        return TrainOutcome(self.results(best), False)

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
            if self.preemption.should_stop():  # SIGTERM: this step is done, checkpoint it and stop
                self._count_train_time()
                self.checkpoint()
                raise Preempted(state.step, str(self.ckpt_root / f"step_{state.step:08d}"))
            _maybe_inject_fault(self.cfg, env, state.step)
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

    def _evaluate(self, split: str) -> dict[str, dict[str, float]]:
        env = self.env
        return self.evaluator.evaluate(
            self.two_tower, split, device=env.device, rank=env.rank, world_size=env.world_size
        )

    def validate(self) -> None:
        """The epoch just trained: valid metric, best-weights checkpoint, early stopping, the epoch's checkpoint."""
        state, env, metric = self.state, self.env, self.cfg.eval.valid_metric
        epoch = state.epoch
        if self.cfg.data.train_on_valid:  # nothing held out: every epoch is "the best", the last one is tested
            score = state.best_score
            if env.is_main:
                log.info("epoch %d: trained on train + valid (no validation)", epoch)
        else:
            valid = self._evaluate("valid")
            score = valid["two_tower"][metric]
            self.metrics_log.write(
                {"step": state.step, "epoch": epoch, **{f"valid/{k}": v for k, v in valid["two_tower"].items()}}
            )
            if env.is_main:
                log.info("epoch %d: valid %s = %.4f (best %.4f)", epoch, metric, score, max(state.best_score, score))
        self._log_managed(epoch)
        state.epoch, state.next_batch = epoch + 1, 0
        if self.cfg.data.train_on_valid or score > state.best_score:
            state.best_score, state.best_epoch, state.bad_epochs = score, epoch, 0
            self.checkpoint("best", with_optimizer=False)
        else:
            state.bad_epochs += 1
            patience = self.tcfg.early_stopping_patience
            if patience and state.bad_epochs >= patience:
                if env.is_main:
                    log.info("early stop: no better valid %s for %d epochs", metric, state.bad_epochs)
                state.early_stopped = True
        self.checkpoint()
        if self.preemption.should_stop():  # SIGTERM during validation: the epoch's checkpoint is written
            raise Preempted(state.step, str(self.ckpt_root / f"step_{state.step:08d}"))

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

    def restore_best(self) -> Path | None:
        """Load the best epoch's weights (``None``: no validation chose one; the last step's weights stay)."""
        best = _best_weights(self.ckpt_root, self.state)
        if best is not None:
            load_checkpoint(self.sharded, best, env=self.env, with_optimizer=False)
        return best

    def results(self, best: Path | None) -> dict[str, Any]:
        """What results.json holds of the training (the evaluation stage adds valid, test and the rankers)."""
        state, data = self.state, self.data
        counts = {s: int(data.meta.get("counts", {}).get(s, len(v))) for s, v in data.splits.items()}
        return {
            "train": {
                "samples_per_s": state.samples / max(state.train_seconds, 1e-9),
                "samples": state.samples,
                "seconds": state.train_seconds,
                "steps": state.step,
                "best_epoch": state.best_epoch,
                "world_size": self.env.world_size,
            },
            "dataset": {
                **({"given_split": data.meta["given_split"]} if "given_split" in data.meta else {}),  # dropped rows
                "dir": str(data.dir),
                "name": data.meta.get("name"),
                "protocol": data.meta.get("protocol"),
                "counts": {
                    **counts,
                    "users": data.num_users,
                    "items": data.num_items,
                    "categories": data.num_categories,
                },
            },
            "checkpoint": str(best) if best is not None else "",  # the weights tested ("": the last step's)
            **({"managed": self.managed} if self.managed else {}),  # model.id_mapping=managed
        }
