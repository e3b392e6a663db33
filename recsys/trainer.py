"""Training loop: epochs over seeded global batches, validation each epoch, early stopping, test.

Tests and scripts call :func:`fit` with a typed :class:`~recsys.config.Config`; only
``recsys.train`` sees Hydra. Outputs (rank 0 only) in ``run_dir``::

    results.json    test / valid metrics of the two-tower and the popularity baseline, throughput, dataset
    metrics.jsonl   one JSON object per log step and per epoch
    tb/             TensorBoard curves
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from data_pipelines.prepare import prepare_dataset
from recsys.config import Config
from recsys.data.batches import FeatureBuilder, TrainBatches
from recsys.data.dataset import RetrievalData, load_dataset
from recsys.data.features import query_features
from recsys.distributed.collectives import make_candidate_gather
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.sharding import ShardedModel, shard_model
from recsys.distributed.snapshot import restore, snapshot
from recsys.evaluation.evaluator import Evaluator
from recsys.model.task import RetrievalTask
from recsys.model.two_tower import TwoTower, table_configs
from recsys.reporting import MetricsLog, format_results_table, write_json_atomic

log = logging.getLogger(__name__)


def build_task(cfg: Config, data: RetrievalData) -> RetrievalTask:
    """The model (tables on the meta device, towers seeded) wrapped in its loss."""
    tables = cfg.model.tables
    for name in ("user", "item", "category"):
        if name not in tables:
            raise ValueError(f"model.tables.{name}: missing (tables given: {sorted(tables)})")
    unknown = set(tables) - {"user", "item", "category"}
    if unknown:
        raise ValueError(f"model.tables: unknown tables {sorted(unknown)}; expected user, item, category")
    torch.manual_seed(cfg.trainer.seed)
    qf = query_features(cfg.data.history_length)
    configs = table_configs(
        num_rows=data.table_num_rows,
        dims={t: c.embedding_dim for t, c in tables.items()},
        poolings={t: c.pooling for t, c in tables.items()},
        query_features=qf,
    )
    model = TwoTower(configs, query_features=qf, tower_dims=cfg.model.tower_dims)
    return RetrievalTask(
        model,
        item_counts=torch.from_numpy(data.item_counts()),
        temperature=cfg.model.temperature,
        logq_correction=cfg.model.logq_correction,
        num_uniform_negatives=cfg.model.num_uniform_negatives,
    )


def _prepare_on_rank0(cfg: Config, env: DistEnv) -> Path:
    holder = [str(prepare_dataset(cfg.data)) if env.is_main else None]
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
    try:
        sharded, results = _fit(cfg, Path(run_dir), env)
        return results
    finally:
        del sharded  # before the group goes: torchrec's threads otherwise abort the exit
        destroy_distributed(env)


def _fit(cfg: Config, run_dir: Path, env: DistEnv):
    tcfg = cfg.trainer
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset_dir = _prepare_on_rank0(cfg, env)
    data = load_dataset(dataset_dir)
    log.info("dataset %s: %s", dataset_dir, {s: len(v) for s, v in data.splits.items()})

    task = build_task(cfg, data)
    sharded = shard_model(
        task, sharding=cfg.sharding, sparse=cfg.optim.sparse, dense=cfg.optim.dense, env=env, seed=tcfg.seed
    )
    if env.is_main:
        log.info("sharding plan:\n%s", sharded.plan)
    dmp, optimizer = sharded.module, sharded.optimizer
    dmp.module.gather_candidates = make_candidate_gather(env.rank, env.world_size)
    two_tower = dmp.module.model

    batches = TrainBatches(
        data,
        history_length=cfg.data.history_length,
        global_batch_size=tcfg.global_batch_size,
        num_uniform_negatives=cfg.model.num_uniform_negatives,
        seed=tcfg.seed,
        rank=env.rank,
        world_size=env.world_size,
    )
    evaluator = Evaluator(
        data, FeatureBuilder(data, cfg.data.history_length), ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size, chunk_size=cfg.eval.chunk_size,
    )
    steps_per_epoch = len(batches) if tcfg.max_steps_per_epoch <= 0 else min(len(batches), tcfg.max_steps_per_epoch)
    metrics_log = MetricsLog(run_dir, enabled=env.is_main)
    best_score, best_epoch, best_state, bad_epochs = -math.inf, -1, None, 0
    valid_metric = cfg.eval.valid_metric
    train_seconds, step = 0.0, 0
    try:
        for epoch in range(tcfg.epochs):
            dmp.train()
            progress = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}", disable=not (env.is_main and tcfg.progress_bar), leave=False)
            epoch_start, window_start, window_losses = time.perf_counter(), time.perf_counter(), []
            for i, batch in enumerate(batches.epoch(epoch)):
                if i >= steps_per_epoch:
                    break
                batch = batch.to(env.device)
                loss, _ = dmp(batch)
                loss.backward()  # the fused sparse optimizer updates the looked-up rows in here
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                progress.update(1)
                window_losses.append(loss.detach())
                if step % tcfg.log_every_steps == 0 or i == steps_per_epoch - 1:
                    mean_loss = _global_mean(torch.stack(window_losses).mean(), env)
                    elapsed = time.perf_counter() - window_start
                    samples_per_s = len(window_losses) * tcfg.global_batch_size / max(elapsed, 1e-9)
                    metrics_log.write({"step": step, "epoch": epoch, "loss": mean_loss, "samples_per_s": samples_per_s})
                    progress.set_postfix(loss=f"{mean_loss:.4f}")
                    window_start, window_losses = time.perf_counter(), []
            progress.close()
            train_seconds += time.perf_counter() - epoch_start

            valid = evaluator.evaluate(two_tower, "valid", device=env.device, rank=env.rank, world_size=env.world_size)
            score = valid["two_tower"][valid_metric]
            metrics_log.write({"step": step, "epoch": epoch, **{f"valid/{k}": v for k, v in valid["two_tower"].items()}})
            if env.is_main:
                log.info("epoch %d: valid %s = %.4f (best %.4f)", epoch, valid_metric, score, max(best_score, score))
            if score > best_score:
                best_score, best_epoch, bad_epochs = score, epoch, 0
                best_state = snapshot(dmp)
            else:
                bad_epochs += 1
                if tcfg.early_stopping_patience and bad_epochs >= tcfg.early_stopping_patience:
                    if env.is_main:
                        log.info("early stop: no better valid %s for %d epochs", valid_metric, bad_epochs)
                    break
        if best_state is not None:
            restore(dmp, best_state)
        valid = evaluator.evaluate(two_tower, "valid", device=env.device, rank=env.rank, world_size=env.world_size, with_popularity=True)
        test = evaluator.evaluate(two_tower, "test", device=env.device, rank=env.rank, world_size=env.world_size, with_popularity=True)
    finally:
        metrics_log.close()

    results = {
        "test": test,
        "valid": valid,
        "train": {
            "samples_per_s": step * tcfg.global_batch_size / max(train_seconds, 1e-9),
            "seconds": train_seconds,
            "steps": step,
            "best_epoch": best_epoch,
            "world_size": env.world_size,
        },
        "dataset": {
            "dir": str(data.dir),
            "name": data.meta.get("name"),
            "protocol": data.meta.get("protocol"),
            "counts": {**{s: len(v) for s, v in data.splits.items()}, "users": data.num_users, "items": data.num_items, "categories": data.num_categories},
        },
    }
    if env.is_main:
        write_json_atomic(run_dir / "results.json", results)
        print(format_results_table(results, cfg.eval.ks), flush=True)
    return sharded, results
