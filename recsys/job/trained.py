"""A finished run read back: its weights on this job's ranks (any world size) for inference, and
``recsys.evaluate``'s report of it; a run dir is read only while no training writes it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np

from recsys.config import (
    Config,
    EvaluateConfig,
    SparseOptimConfig,
)  # fmt: skip
from recsys.data.dataset import RetrievalData
from recsys.data.layout import FeatureLayout
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.rank_data import rank_user_range
from recsys.distributed.sharding import ShardedModel, inference_sharding, shard_model
from recsys.job.assemble import open_dataset, prepare_dataset_on_rank0
from recsys.job.checks import (
    check_evaluate_names,
    warn_ks_beyond_catalogue,
)
from recsys.job.offline import check_splits, evaluate_trained
from recsys.job.plan import run_layout
from recsys.model.build import build_task
from recsys.rankers.plugins import load_plugins
from recsys.rundir.checkpoint import load_checkpoint
from recsys.rundir.config import checkpoint_dir, load_run_config
from recsys.rundir.lock import reading_run_dir

log = logging.getLogger(__name__)

REFIT_DIR = "refit"  # <run dir>/refit: trainer.refit's second stage, a run dir of its own


class TrainedRun(NamedTuple):
    data: RetrievalData
    layout: FeatureLayout  # the run's feature layout over ``data`` (recsys/job/plan.py)
    sharded: ShardedModel
    checkpoint: Path  # the checkpoint dir whose weights were loaded


def load_trained(cfg: Config, run_dir: Path, checkpoint: str, env: DistEnv, *, whole_data: bool = True) -> TrainedRun:
    """Collective: the dataset and the sharded model with the checkpoint's weights, for this job's ranks.

    ``whole_data=False``: this rank reads only its own users' interactions (``rank_user_range``).
    """
    root = prepare_dataset_on_rank0(cfg.data, env)
    data = open_dataset(cfg, root, None if whole_data else rank_user_range(root, env))
    # weights only: the loss never runs (uniform item frequencies do), the sparse optimizer is never
    # stepped or loaded (SGD keeps no state), and the run's GPU-only sharding choices give way on a
    # CPU machine (DCP reshards)
    layout = run_layout(cfg, data)
    task = build_task(
        cfg.model, data, layout, seed=cfg.trainer.seed, item_counts=np.ones(data.num_items, dtype=np.int64)
    )
    sharded = shard_model(
        task,
        sharding=inference_sharding(cfg.sharding, env.device),
        sparse=SparseOptimConfig(name="sgd"),
        dense=cfg.optim.dense,
        env=env,
        seed=cfg.trainer.seed,
    )
    path = checkpoint_dir(run_dir, checkpoint)
    load_checkpoint(sharded, path, env=env, with_optimizer=False)
    return TrainedRun(data, layout, sharded, path)


def reading_run(run_dir: Path):
    """Context: ``run_dir`` read by evaluate / export, refused while a training writes it (or the run its refit dir
    lies in): recsys/rundir/lock.py."""
    within = [run_dir.parent] if run_dir.name == REFIT_DIR else []
    return reading_run_dir(*within, run_dir)


def evaluate_run(ecfg: EvaluateConfig) -> dict | None:
    """Collective over all ranks: the offline report of a trained run; returns it on rank 0 (None elsewhere)."""
    with reading_run(Path(ecfg.run_dir)):  # every rank, before anything is read
        return _evaluate_run(ecfg)


def _evaluate_run(ecfg: EvaluateConfig) -> dict | None:
    run_dir = Path(ecfg.run_dir)
    cfg = load_run_config(run_dir, ecfg.checkpoint)
    load_plugins(cfg.eval.plugins)  # the run's plug-in rankers, as it ranked with them
    check_evaluate_names(
        ecfg.ann_kinds, ecfg.splits, cfg, ecfg.rankers
    )  # before the weights load and the items are embedded
    env = init_distributed(ecfg.device)  # this machine's device, not necessarily the training run's
    trained = None
    try:
        check_splits(ecfg.splits)
        # rank 0 builds the report from the whole dataset; the others only embed their own users
        trained = load_trained(cfg, run_dir, ecfg.checkpoint, env, whole_data=env.is_main)
        if env.is_main:
            warn_ks_beyond_catalogue(ecfg.ks, trained.data.num_items, "ks")
        return evaluate_trained(ecfg, cfg, run_dir, env, trained)
    finally:
        del trained
        destroy_distributed(env)
