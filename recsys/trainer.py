"""Training loop: epochs over seeded global batches, validation each epoch, early stopping, test.

Tests and scripts call :func:`fit` with a typed :class:`~recsys.config.Config`; only
``recsys.train`` sees Hydra. Outputs (rank 0 only) in ``run_dir``::

    results.json    test / valid metrics of the two-tower and the popularity baseline, throughput, dataset
    metrics.jsonl   one JSON object per log step and per epoch
    tb/             TensorBoard curves
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from itertools import islice
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from tqdm import tqdm

from data_pipelines.prepare import prepare_dataset
from recsys.checkpoint import (
    STATE_FILE, TrainerState, complete_checkpoints, has_optimizer_state, is_complete_checkpoint, latest_checkpoint, load_checkpoint, read_trainer_state, save_checkpoint,
)
from recsys.config import Config, DataConfig, query_uses_user_id
from recsys.data.batch import Batch
from recsys.data.batches import FeatureBuilder, TrainBatches
from recsys.data.dataset import RetrievalData, load_dataset
from recsys.data.features import candidate_tables, query_tables
from recsys.distributed.collectives import candidate_gather
from recsys.distributed.data_shards import load_rank_data
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.plan_summary import plan_summary
from recsys.distributed.sharding import ShardedModel, shard_model
from recsys.evaluation.evaluator import Evaluator
from recsys.logs import FILE_ONLY
from recsys.run_dir import completed_results, result_ks, set_aside_earlier_run
from recsys.model.task import RetrievalTask
from recsys.model.two_tower import TwoTower, table_configs
from recsys.reporting import MetricsLog, drop_records_after, format_results_table, write_json_atomic
from recsys.preemption import Preempted, PreemptionHandler
from recsys.run_lock import lock_run_dir

log = logging.getLogger(__name__)


def build_task(cfg: Config, data: RetrievalData, item_counts: Optional[np.ndarray] = None) -> RetrievalTask:
    """The model (tables on the meta device, towers seeded) wrapped in its loss.

    ``item_counts``: the items' training frequencies for logQ; None = ``data.item_counts()``.
    """
    tables = cfg.model.tables
    user_id = query_uses_user_id(cfg)
    num_rows = {t: n for t, n in data.table_num_rows.items() if user_id or t != "user"}
    for name in num_rows:  # no category table for data without categories: none is faked
        if name not in tables:
            raise ValueError(f"model.tables.{name}: missing (tables given: {sorted(tables)})")
    unknown = set(tables) - {"user", "item", "category"}
    if unknown:
        raise ValueError(f"model.tables: unknown tables {sorted(unknown)}; expected user, item, category")
    torch.manual_seed(cfg.trainer.seed)
    configs = table_configs(
        num_rows=num_rows,
        dims={t: c.embedding_dim for t, c in tables.items()},
        poolings={t: c.pooling for t, c in tables.items()},
    )
    model = TwoTower(
        configs,
        query_tables=query_tables(cfg.data.history_length, data.has_categories, user_id),
        candidate_tables=candidate_tables(data.has_categories),
        tower_dims=cfg.model.tower_dims,
    )
    return RetrievalTask(
        model,
        item_counts=torch.from_numpy(data.item_counts() if item_counts is None else item_counts),
        temperature=cfg.model.temperature,
        logq_correction=cfg.model.logq_correction,
        logq_weight=cfg.model.logq_weight,
        num_uniform_negatives=cfg.model.num_uniform_negatives,
        loss=cfg.model.loss,
        margin=cfg.model.margin,
        negative_weight=cfg.model.negative_weight,
    )


def prepare_dataset_on_rank0(cfg: DataConfig, env: DistEnv) -> Path:
    """Collective: rank 0 prepares (or finds) the dataset dir, every rank gets its path."""
    holder = [str(prepare_dataset(cfg)) if env.is_main else None]
    if env.world_size > 1:
        dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def _global_mean(value: torch.Tensor, env: DistEnv) -> float:
    if env.world_size > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= env.world_size
    return float(value.item())


def fit(cfg: Config, run_dir: str | Path) -> Dict[str, Any]:
    """Train, validate each epoch, restore the best epoch, test; returns what results.json holds."""
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend)
    sharded: Optional[ShardedModel] = None
    lock = None
    try:
        lock = lock_run_dir(Path(run_dir), env)  # a second training in this run dir fails here, naming the owner
        sharded, results = _fit(cfg, Path(run_dir), env)
        return results
    finally:
        del sharded  # before the group goes: torchrec's threads otherwise abort the exit
        if lock is not None:
            lock.release()
        destroy_distributed(env)


def config_fingerprint(cfg: Config) -> str:
    """What the weights depend on (data and model), not where or how they are trained."""
    data = asdict(cfg.data)
    data.pop("root")
    data.pop("shard_by_user")  # how the rows are read, not which
    blob = json.dumps({"data": data, "model": asdict(cfg.model)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resume_path(cfg: Config, ckpt_root: Path, env: DistEnv) -> Optional[Path]:
    resume = cfg.trainer.resume
    if resume == "none":
        if env.is_main:  # an earlier run's checkpoints and logs in this dir: set aside together, never deleted
            set_aside_earlier_run(ckpt_root.parent)
        return None
    if resume == "auto":
        partial = [p for p in ckpt_root.glob("step_*") if not is_complete_checkpoint(p)] if ckpt_root.is_dir() else []
        if partial and env.is_main:
            log.warning("ignoring incomplete checkpoints (no %s): %s", STATE_FILE, ", ".join(sorted(p.name for p in partial)))
        return latest_checkpoint(ckpt_root)
    path = Path(resume)
    if not path.is_dir():
        raise FileNotFoundError(f"trainer.resume={resume!r}: no such checkpoint dir")
    if is_complete_checkpoint(path) and not has_optimizer_state(path):  # best/: saved with_optimizer=False
        raise ValueError(
            f"trainer.resume={resume!r}: {path} holds weights only (the best epoch's; no optimizer state or position "
            f"in the data), so a run cannot continue from it. Continue the run from a step checkpoint (trainer.resume="
            f"auto picks the newest), or start a new run from these weights: trainer.init_from={path} trainer.resume=none"
        )
    return path


def _best_weights(ckpt_root: Path, state: TrainerState) -> Optional[Path]:
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
    raise FileNotFoundError(
        f"{best}: missing or damaged, and no step checkpoint from the end of the best epoch ({state.best_epoch}) is "
        f"left: the weights to test are gone. Restore {best}, or retrain with trainer.resume=none "
        "(the old checkpoints are set aside, not deleted)"
    )


def _init_from(sharded: ShardedModel, path: Path, fingerprint: str, env: DistEnv) -> None:
    """trainer.init_from: another checkpoint's weights, nothing else (optimizer, step, data position, RNG stay new)."""
    saved = read_trainer_state(path).fingerprint
    if saved != fingerprint:
        raise ValueError(f"trainer.init_from={str(path)!r}: weights of another data/model config (fingerprint {saved}, "
                         f"now {fingerprint})")
    rng = torch.get_rng_state()
    load_checkpoint(sharded, path, env=env, with_optimizer=False)
    torch.set_rng_state(rng)  # this run's seed, not the source run's RNG
    if env.is_main:
        log.info("trainer.init_from: starting from the weights in %s", path)


def _check_same_batches(saved: TrainerState, path: Path, global_batch_size: int) -> None:
    """Mid-epoch, the checkpoint's next batch counts batches of its own size: another size would resume at
    another example, training part of the epoch twice or skipping it. At an epoch end any size may follow."""
    if saved.next_batch > 0 and saved.global_batch_size and saved.global_batch_size != global_batch_size:
        raise ValueError(
            f"trainer.global_batch_size={global_batch_size}: {path} was saved mid-epoch (epoch {saved.epoch}, batch "
            f"{saved.next_batch}) with trainer.global_batch_size={saved.global_batch_size}; with another size the rest "
            f"of the epoch would not be exactly its unseen examples. Resume with trainer.global_batch_size="
            f"{saved.global_batch_size} (the size may change at an epoch end), or start over with trainer.resume=none"
        )


def _maybe_inject_fault(cfg: Config, env: DistEnv, step: int) -> None:
    """Die like a preempted or OOM-killed worker, on the first attempt only (torchrun counts restarts)."""
    t = cfg.trainer
    if t.fault_at_step and step == t.fault_at_step and env.rank == t.fault_rank:
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
            log.warning("fault injection: rank %d exits after step %d", env.rank, step)
            os._exit(13)


def make_train_step(cfg: Config, sharded: ShardedModel, env: DistEnv):
    """(pipeline or None, step(batch iterator) -> detached loss); StopIteration when batches run out."""
    dmp, optimizer = sharded.module, sharded.optimizer
    if cfg.trainer.pipeline == "sparse_dist":
        pipeline = TrainPipelineSparseDist(dmp, optimizer, env.device, execute_all_batches=True)
        return pipeline, pipeline.progress  # returns the task's second output: the detached loss
    if cfg.trainer.pipeline != "none":
        raise ValueError(f"trainer.pipeline={cfg.trainer.pipeline!r}: expected 'none' or 'sparse_dist'")

    def step(batches: Iterator[Batch]) -> torch.Tensor:
        batch = next(batches).to(env.device, non_blocking=True)  # pinned on GPU: no host sync
        loss, _ = dmp(batch)
        loss.backward()  # the fused sparse optimizer updates the looked-up rows in here
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    return None, step


def _fit(cfg: Config, run_dir: Path, env: DistEnv):
    tcfg = cfg.trainer
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset_dir = prepare_dataset_on_rank0(cfg.data, env)
    example_counts = None  # every rank's training examples, when each holds its own users only
    if cfg.data.shard_by_user:
        data, example_counts = load_rank_data(dataset_dir, env)
        log.info("dataset %s, users %s of rank %d: %s", dataset_dir, data.user_range, env.rank,
                 {s: len(v) for s, v in data.splits.items()})
    else:
        data = load_dataset(dataset_dir)
        log.info("dataset %s: %s", dataset_dir, {s: len(v) for s, v in data.splits.items()})

    task = build_task(cfg, data)
    sharded = shard_model(
        task, sharding=cfg.sharding, sparse=cfg.optim.sparse, dense=cfg.optim.dense, env=env, seed=tcfg.seed,
        pretrained={t: c.pretrained_path for t, c in cfg.model.tables.items() if c.pretrained_path},
        frozen_tables=[t for t, c in cfg.model.tables.items() if c.frozen],
        batch_size_per_rank=-(-tcfg.global_batch_size // env.world_size),
    )
    if env.is_main:
        shapes = {t: (rows, cfg.model.tables[t].embedding_dim) for t, rows in data.table_num_rows.items()}
        log.info("%s", plan_summary(sharded.plan, shapes, env.world_size))
        log.info("sharding plan:\n%s", sharded.plan, extra=FILE_ONLY)
    dmp = sharded.module
    dmp.module.gather_candidates = candidate_gather(env.rank, env.world_size)
    two_tower = dmp.module.model

    ckpt_root = run_dir / "checkpoints"
    fingerprint = config_fingerprint(cfg)
    state = TrainerState(fingerprint=fingerprint, world_size=env.world_size, global_batch_size=tcfg.global_batch_size)
    resume_from = _resume_path(cfg, ckpt_root, env)
    done = completed_results(run_dir, resume_from, fingerprint, tcfg.epochs) if tcfg.resume == "auto" else None
    if done is not None:  # a finished run is not trained again (the same answer on every rank: same files)
        if env.is_main:
            print(format_results_table(done, result_ks(done)), flush=True)
        return sharded, done
    if resume_from is not None:
        saved_state = read_trainer_state(resume_from)
        saved = saved_state.fingerprint  # before loading: other shapes would fail inside DCP
        if saved != fingerprint:
            raise ValueError(
                f"{resume_from}: saved for another data/model config (fingerprint {saved}, "
                f"now {fingerprint}); use trainer.resume=none or another run_name"
            )
        _check_same_batches(saved_state, resume_from, tcfg.global_batch_size)
        state = load_checkpoint(sharded, resume_from, env=env)
        state.global_batch_size = tcfg.global_batch_size
        if env.is_main:
            log.info("resumed from %s: step %d, epoch %d, batch %d", resume_from, state.step, state.epoch, state.next_batch)
        if cfg.data.shard_by_user and state.next_batch > 0 and state.world_size != env.world_size and env.is_main:
            log.warning("data.shard_by_user: resuming mid-epoch on %d ranks, saved on %d: the users' split across ranks "
                        "changed, so the rest of epoch %d is not exactly the remainder of the interrupted one",
                        env.world_size, state.world_size, state.epoch)
        state.world_size = env.world_size
    elif tcfg.init_from:
        _init_from(sharded, Path(tcfg.init_from), fingerprint, env)

    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(cfg))

    def checkpoint(name: Optional[str] = None, with_optimizer: bool = True) -> None:
        save_checkpoint(sharded, state, root=ckpt_root, env=env, name=name, keep_last=tcfg.keep_last_checkpoints,
                        with_optimizer=with_optimizer, config_yaml=config_yaml)

    batches = TrainBatches(
        data,
        history_length=cfg.data.history_length,
        global_batch_size=tcfg.global_batch_size,
        num_uniform_negatives=cfg.model.num_uniform_negatives,
        seed=tcfg.seed,
        query_history=cfg.data.query_history,
        history_dropout=cfg.data.history_dropout,
        user_id=query_uses_user_id(cfg),
        rank=env.rank,
        world_size=env.world_size,
        pin_memory=env.device.type == "cuda",  # built (and pinned) on the prefetch thread, off the step
        rank_example_counts=example_counts,
    )
    evaluator = Evaluator(
        data, FeatureBuilder(data, cfg.data.history_length, query_uses_user_id(cfg)), ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size, chunk_size=cfg.eval.chunk_size, per_rank_users=cfg.data.shard_by_user,
    )
    pipeline, train_step = make_train_step(cfg, sharded, env)
    steps_per_epoch = len(batches) if tcfg.max_steps_per_epoch <= 0 else min(len(batches), tcfg.max_steps_per_epoch)
    if resume_from is not None and env.is_main:
        drop_records_after(run_dir / "metrics.jsonl", state.step)  # logged after the checkpoint, before a crash
    metrics_log = MetricsLog(run_dir, enabled=env.is_main)
    valid_metric = cfg.eval.valid_metric
    preemption = PreemptionHandler(tcfg.preemption_grace_s, rank=env.rank, world_size=env.world_size, device=env.device)
    try:
        preemption.install()  # SIGTERM now sets a flag; checked after every step
        while not state.early_stopped and state.epoch < tcfg.epochs:
            epoch = state.epoch
            dmp.train()
            progress = tqdm(total=steps_per_epoch, initial=state.next_batch, desc=f"epoch {epoch}",
                            disable=not (env.is_main and tcfg.progress_bar), leave=False)
            epoch_start, window_start, window_losses, window_samples = time.perf_counter(), time.perf_counter(), [], state.samples
            remaining = islice(batches.epoch(epoch, start_batch=state.next_batch), max(0, steps_per_epoch - state.next_batch))
            for i in range(state.next_batch, steps_per_epoch):
                try:
                    loss = train_step(remaining)
                except StopIteration:
                    break
                state.step += 1
                state.samples += int(batches.bounds[i + 1] - batches.bounds[i])
                state.next_batch = i + 1
                progress.update(1)
                window_losses.append(loss)
                if state.step % tcfg.log_every_steps == 0 or i == steps_per_epoch - 1:
                    mean_loss = _global_mean(torch.stack(window_losses).mean(), env)
                    if not math.isfinite(mean_loss):  # the same on every rank: they stop together
                        raise FloatingPointError(f"training loss is {mean_loss} at step {state.step} (epoch {epoch}); "
                                                 "check pretrained tables and learning rates")
                    elapsed = time.perf_counter() - window_start
                    samples_per_s = (state.samples - window_samples) / max(elapsed, 1e-9)
                    metrics_log.write({"step": state.step, "epoch": epoch, "loss": mean_loss, "samples_per_s": samples_per_s})
                    if env.is_main and not tcfg.progress_bar:
                        log.info("epoch %d step %d: loss %.4f, %.0f samples/s", epoch, state.step, mean_loss, samples_per_s)
                    progress.set_postfix(loss=f"{mean_loss:.4f}")
                    window_start, window_losses, window_samples = time.perf_counter(), [], state.samples
                if tcfg.checkpoint_every_steps and state.step % tcfg.checkpoint_every_steps == 0 and i < steps_per_epoch - 1:
                    state.train_seconds += time.perf_counter() - epoch_start
                    epoch_start = time.perf_counter()
                    checkpoint()
                if preemption.should_stop():  # SIGTERM: this step is done, checkpoint it and stop
                    state.train_seconds += time.perf_counter() - epoch_start
                    checkpoint()
                    raise Preempted(state.step, str(ckpt_root / f"step_{state.step:08d}"))
                _maybe_inject_fault(cfg, env, state.step)
            progress.close()
            state.train_seconds += time.perf_counter() - epoch_start
            if pipeline is not None:
                pipeline.detach()  # give the sharded modules their own forward back for evaluation

            valid = evaluator.evaluate(two_tower, "valid", device=env.device, rank=env.rank, world_size=env.world_size)
            score = valid["two_tower"][valid_metric]
            metrics_log.write({"step": state.step, "epoch": epoch, **{f"valid/{k}": v for k, v in valid["two_tower"].items()}})
            if env.is_main:
                log.info("epoch %d: valid %s = %.4f (best %.4f)", epoch, valid_metric, score, max(state.best_score, score))
            state.epoch, state.next_batch = epoch + 1, 0
            if score > state.best_score:
                state.best_score, state.best_epoch, state.bad_epochs = score, epoch, 0
                checkpoint("best", with_optimizer=False)
            else:
                state.bad_epochs += 1
                if tcfg.early_stopping_patience and state.bad_epochs >= tcfg.early_stopping_patience:
                    if env.is_main:
                        log.info("early stop: no better valid %s for %d epochs", valid_metric, state.bad_epochs)
                    state.early_stopped = True
            checkpoint()
            if preemption.should_stop():  # SIGTERM during validation: the epoch's checkpoint is written
                raise Preempted(state.step, str(ckpt_root / f"step_{state.step:08d}"))
        preemption.restore()  # the test evaluation is not resumable work: SIGTERM stops it at once again
        best = _best_weights(ckpt_root, state)
        if best is not None:
            load_checkpoint(sharded, best, env=env, with_optimizer=False)
        valid = evaluator.evaluate(two_tower, "valid", device=env.device, rank=env.rank, world_size=env.world_size, with_popularity=True)
        test = evaluator.evaluate(two_tower, "test", device=env.device, rank=env.rank, world_size=env.world_size, with_popularity=True)
    finally:
        preemption.restore()
        metrics_log.close()

    results = {
        "test": test,
        "valid": valid,
        "train": {
            "samples_per_s": state.samples / max(state.train_seconds, 1e-9),
            "samples": state.samples,
            "seconds": state.train_seconds,
            "steps": state.step,
            "best_epoch": state.best_epoch,
            "world_size": env.world_size,
        },
        "dataset": {
            "dir": str(data.dir),
            "name": data.meta.get("name"),
            "protocol": data.meta.get("protocol"),
            "counts": {**{s: int(data.meta.get("counts", {}).get(s, len(v))) for s, v in data.splits.items()}, "users": data.num_users, "items": data.num_items, "categories": data.num_categories},
        },
        "checkpoint": str(best) if best is not None else "",  # the weights tested ("": the last step's)
    }
    if env.is_main:
        write_json_atomic(run_dir / "results.json", results)
        print(format_results_table(results, cfg.eval.ks), flush=True)
    return sharded, results
