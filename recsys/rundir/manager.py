"""A run's checkpoint policy: where it starts from, what it saves and keeps, which weights it tests.

    start          trainer.resume: set an earlier run aside (none), the newest complete step checkpoint (auto)
                   or a named one; a finished run (auto) is recognised and its results returned, not retrained;
                   a run trained further sets the bundle and reports of its earlier weights aside
    resume         the chosen checkpoint's weights, optimizer state and position, or trainer.init_from's weights
    save           a step checkpoint (trainer.keep_last_checkpoints kept) or ``best/`` (weights only)
    restore_best   the best epoch's weights before testing: ``best/``, else the step checkpoint of that epoch's end

The Trainer owns the loop and its :class:`~recsys.rundir.checkpoint.TrainerState`; this class owns the files.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import torch

from recsys.config import TrainerConfig
from recsys.config.fingerprint import RunIdentity, weights_fingerprint
from recsys.data.dataset import RetrievalData
from recsys.distributed.env import DistEnv
from recsys.distributed.managed import restore_counts
from recsys.distributed.sharding import ShardedModel
from recsys.rundir.checkpoint import (
    STATE_FILE,
    TrainerState,
    check_checkpoint_files,
    complete_checkpoints,
    has_optimizer_state,
    is_complete_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    read_trainer_state,
    save_checkpoint,
)  # fmt: skip
from recsys.rundir.continuous import (
    check_managed,
    check_slice_order,
    checkpoint_config,
    init_checkpoint,
    saved_world_size,
)
from recsys.rundir.dir import (
    completed_results,
    is_finished,
    set_aside_earlier_run,
    set_aside_outputs,
    tidy_earlier_logs,
)
from recsys.utils.refusals import ANOTHER_RUN_DIR, MissingPath, RunRefused

log = logging.getLogger(__name__)


def resume_path(resume: str, ckpt_root: Path, env: DistEnv) -> Path | None:
    """The checkpoint trainer.resume (``resume``) names (None: start over), after setting aside an earlier run for
    resume=none."""
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


def best_weights(ckpt_root: Path, state: TrainerState) -> Path | None:
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


class Start(NamedTuple):
    resume_from: Path | None  # the checkpoint to continue (None: a new run, from trainer.init_from if set)
    finished: dict[str, Any] | None  # trainer.resume=auto on a finished run: its results.json (nothing to train)


class CheckpointManager:
    """The checkpoints of one run dir (``<run_dir>/checkpoints/``) for one (run, sharded model) pair: ``identity``
    (recsys.config.fingerprint.run_identity) is what the run saves with each checkpoint and compares them against,
    ``tcfg`` its trainer section."""

    def __init__(
        self,
        tcfg: TrainerConfig,
        identity: RunIdentity,
        run_dir: Path,
        env: DistEnv,
        sharded: ShardedModel,
        data: RetrievalData,
    ) -> None:
        self.tcfg, self.identity, self.run_dir, self.env, self.sharded, self.data = (
            tcfg, identity, run_dir, env, sharded, data,
        )  # fmt: skip
        self.root = run_dir / "checkpoints"
        self.fingerprint = identity.fingerprint
        self.config_yaml = identity.config_yaml
        self.init_path: Path | None = None  # trainer.init_from's checkpoint, once start() has checked it

    def step_path(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def start(self) -> Start:
        """Which checkpoint the run continues, or (trainer.resume=auto) the results of a finished one. Whatever
        would refuse loading it (or trainer.init_from's) is refused here, before the run writes anything."""
        resume_from = resume_path(self.tcfg.resume, self.root, self.env)
        if resume_from is not None:
            self._check_resumable(resume_from)
        elif self.tcfg.init_from:
            self.init_path = self._check_init_from(Path(self.tcfg.init_from))
        done = None
        if self.tcfg.resume == "auto":  # the same answer on every rank: the same files
            done = completed_results(self.run_dir, resume_from, self.fingerprint, self.tcfg.epochs)
        if (
            resume_from is not None
            and self.env.is_main
            and not is_finished(read_trainer_state(resume_from), self.tcfg.epochs)
        ):
            set_aside_outputs(self.run_dir, resume_from)  # the bundle and reports of the weights it trains on from
        return Start(resume_from, done)

    def tidy_logs(self, resumed_step: int | None) -> None:
        """A crashed attempt's records: after the resumed step, or all of them with none to resume (rank 0)."""
        if self.env.is_main:
            tidy_earlier_logs(self.run_dir, resumed_step)

    def save(self, state: TrainerState, name: str | None = None, with_optimizer: bool = True) -> None:
        """Collective: a step checkpoint (the oldest beyond trainer.keep_last_checkpoints removed), or ``name``."""
        save_checkpoint(
            self.sharded,
            state,
            root=self.root,
            env=self.env,
            name=name,
            keep_last=self.tcfg.keep_last_checkpoints,
            with_optimizer=with_optimizer,
            config_yaml=self.config_yaml,
        )

    def resume(self, resume_from: Path | None, state: TrainerState) -> TrainerState:
        """Collective: load ``resume_from`` (``start``'s choice) and return its state, or with None load
        trainer.init_from's weights if set and return ``state`` unchanged."""
        if resume_from is None:
            if self.tcfg.init_from:
                self._init_from(Path(self.tcfg.init_from))
            return state
        state = TrainerState(**asdict(load_checkpoint(self.sharded, resume_from, env=self.env)))
        env = self.env
        restore_counts(self.sharded.module, state.managed_counts, env.rank)  # the run's counts, not this process's
        state.global_batch_size = self.tcfg.global_batch_size
        if env.is_main:
            log.info(
                "resumed from %s: step %d, epoch %d, batch %d", resume_from, state.step, state.epoch, state.next_batch
            )
        if (
            self.identity.data.shard_by_user
            and state.next_batch > 0
            and state.world_size != env.world_size
            and env.is_main
        ):
            log.warning(
                "data.shard_by_user: resuming mid-epoch on %d ranks, saved on %d: the users' split across ranks "
                "changed, so the rest of epoch %d is not exactly the remainder of the interrupted one",
                env.world_size,
                state.world_size,
                state.epoch,
            )
        state.world_size = env.world_size
        return state

    def _check_resumable(self, resume_from: Path) -> None:
        """``resume_from`` was saved by this data / model config with what this run can load, or a refusal."""
        saved_state = read_trainer_state(resume_from)
        saved_cfg = checkpoint_config(resume_from)
        if saved_cfg is not None:  # another zch_size / policy / world size, named before the fingerprint differs
            check_managed(
                "trainer.resume",
                resume_from,
                saved_cfg.model,
                self.identity.model,
                saved_world_size(saved_state),
                self.env.world_size,
            )
        if saved_state.fingerprint != self.fingerprint:  # before loading: other shapes would fail inside DCP
            raise RunRefused(
                f"{resume_from}: saved for another data/model config (fingerprint {saved_state.fingerprint}, "
                f"now {self.fingerprint}); use trainer.resume=none (this run is set aside) or {ANOTHER_RUN_DIR}"
            )
        _check_same_batches(saved_state, resume_from, self.tcfg.global_batch_size)
        check_checkpoint_files(resume_from)

    def _check_init_from(self, path: Path) -> Path:
        """trainer.init_from's checkpoint (a run dir: its newest), if this run can start from it, or a refusal."""
        path = init_checkpoint(path)
        state, saved_cfg = read_trainer_state(path), checkpoint_config(path)
        if saved_cfg is not None:
            check_managed(
                "trainer.init_from",
                path,
                saved_cfg.model,
                self.identity.model,
                saved_world_size(state),
                self.env.world_size,
            )
        # the run's fingerprint, or (data.slices) the same model on another slice of the same log
        same = state.fingerprint == self.fingerprint or (
            saved_cfg is not None and weights_fingerprint(saved_cfg) == self.identity.weights_fingerprint
        )
        if not same:
            raise RunRefused(
                f"trainer.init_from={str(path)!r}: weights of another data/model config (fingerprint "
                f"{state.fingerprint}, now {self.fingerprint})"
            )
        if saved_cfg is not None:
            check_slice_order(path, saved_cfg.data, self.identity.data, self.data)
        with_optimizer = self.tcfg.init_optimizer
        if with_optimizer and not has_optimizer_state(path):
            raise RunRefused(
                f"trainer.init_optimizer=true: {path} holds weights only (no optimizer state); name a step checkpoint "
                "or the run dir, or set trainer.init_optimizer=false"
            )
        check_checkpoint_files(path)
        return path

    def _init_from(self, path: Path) -> None:
        """trainer.init_from: another checkpoint's weights (a run dir: its newest step checkpoint), with
        trainer.init_optimizer its optimizer state too; step, data position and RNG stay new
        (recsys/rundir/continuous.py)."""
        path = self.init_path or self._check_init_from(path)  # start() checked it
        with_optimizer = self.tcfg.init_optimizer
        rng = torch.get_rng_state()
        load_checkpoint(self.sharded, path, env=self.env, with_optimizer=with_optimizer)
        torch.set_rng_state(rng)  # this run's seed, not the source run's RNG
        if self.env.is_main:
            log.info(
                "trainer.init_from: starting from the weights%s in %s",
                " and optimizer state" if with_optimizer else "",
                path,
            )

    def restore_best(self, state: TrainerState) -> Path | None:
        """Collective: load the best epoch's weights (``None``: no validation chose one; the last step's stay)."""
        best = best_weights(self.root, state)
        if best is not None:
            load_checkpoint(self.sharded, best, env=self.env, with_optimizer=False)
        return best
