"""The run's pieces, built from its config: the dataset (prepared on rank 0; each rank's own users with
data.shard_by_user), the sharded model with its optimizers, the training batches and the evaluator.

    prepare_dataset_on_rank0   rank 0 prepares (or finds) the dataset dir, every rank gets its path
    load_data                  the whole dataset, or this rank's users only (data.shard_by_user)
    shard_for_training         build_task -> shard_model with the run's optimizers, pretrained / frozen tables
    train_batches, run_evaluator   the seeded global batches, the per-epoch validation and the stage's embeddings

Each takes the run's feature layout from its plan (recsys/job/plan.py), resolved once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import torch.distributed as dist

from data_pipelines.prepare import prepare_dataset
from recsys.config import Config, DataConfig, IdMapping
from recsys.data.batch_bounds import ceil_div
from recsys.data.batches import TrainBatches
from recsys.data.dataset import RetrievalData, load_dataset, with_valid_in_train
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.layout import FeatureLayout
from recsys.data.neighbors import with_item_neighbors
from recsys.data.raw_ids import with_raw_ids
from recsys.data.side_features import with_side_features
from recsys.data.slices import with_slice
from recsys.distributed.env import DistEnv
from recsys.distributed.plan_summary import plan_summary
from recsys.distributed.rank_data import load_rank_data
from recsys.distributed.sharding import ShardedModel, shard_model
from recsys.job.checks import note_dropped_rows
from recsys.model.build import build_task
from recsys.ranking.sharded import Evaluator
from recsys.utils.logs import FILE_ONLY

log = logging.getLogger(__name__)


def prepare_dataset_on_rank0(cfg: DataConfig, env: DistEnv) -> Path:
    """Collective: rank 0 prepares (or finds) the dataset dir, every rank gets its path."""
    holder = [str(prepare_dataset(cfg)) if env.is_main else None]
    if env.world_size > 1:
        dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


class RunData(NamedTuple):
    data: RetrievalData
    example_counts: list[int] | None  # every rank's training examples when each holds its own users; else None


def open_dataset(cfg: Config, root: str | Path, user_range: tuple[int, int] | None = None) -> RetrievalData:
    """The dataset dir as a run reads it: with the items' neighbours (``data.item_neighbors``) and
    ``model.features``' columns, so that the model and the batches agree on every feature."""
    data = load_dataset(root, user_range)
    if cfg.data.slices:  # the continuous-training replay: train on a time window, test on the next one
        data = with_slice(data, cfg.data.slices, cfg.data.slice, cfg.data.slice_window)
    if cfg.data.train_on_valid:
        data = with_valid_in_train(data)
    return with_run_features(cfg, data)


def with_run_features(cfg: Config, data: RetrievalData) -> RetrievalData:
    """What every way of reading a run's rows adds, in one order: the items' neighbours (``data.item_neighbors``),
    ``model.features``' columns and, with managed ids, the raw ids the managed tables read."""
    data = with_side_features(with_item_neighbors(data, cfg.data.item_neighbors), cfg.model.features)
    return with_raw_ids(data) if cfg.model.id_mapping == IdMapping.managed else data


def load_data(cfg: Config, env: DistEnv) -> RunData:
    """Collective: the run's dataset, prepared on rank 0; each rank's own users only with data.shard_by_user."""
    dataset_dir = prepare_dataset_on_rank0(cfg.data, env)
    if env.is_main:
        note_dropped_rows(dataset_dir)  # a given split's dropped rows: console and train.log
    if cfg.data.shard_by_user:
        data, example_counts = load_rank_data(dataset_dir, env, cfg.data.train_on_valid)
        data = with_run_features(cfg, data)
        log.info(
            "dataset %s, users %s of rank %d: %s",
            dataset_dir,
            data.user_range,
            env.rank,
            {s: len(v) for s, v in data.splits.items()},
        )
        return RunData(data, example_counts)
    data = open_dataset(cfg, dataset_dir)
    log.info("dataset %s: %s", dataset_dir, {s: len(v) for s, v in data.splits.items()})
    return RunData(data, None)


def shard_for_training(cfg: Config, data: RetrievalData, layout: FeatureLayout, env: DistEnv) -> ShardedModel:
    """Collective: the run's model for ``data`` and ``layout``, planned, sharded and initialised, with its
    optimizers."""
    sharded = shard_model(
        build_task(cfg.model, data, layout, seed=cfg.trainer.seed),
        sharding=cfg.sharding,
        sparse=cfg.optim.sparse,
        dense=cfg.optim.dense,
        env=env,
        seed=cfg.trainer.seed,
        pretrained={t: c.pretrained_path for t, c in cfg.model.tables.items() if c.pretrained_path},
        frozen_tables=[t for t, c in cfg.model.tables.items() if c.frozen],
        batch_size_per_rank=ceil_div(cfg.trainer.global_batch_size, env.world_size),
    )
    if env.is_main:
        shapes = {t: (rows, cfg.model.tables[t].embedding_dim) for t, rows in data.table_num_rows.items()}
        log.info("%s", plan_summary(sharded.plan, shapes, env.world_size))
        log.info("sharding plan:\n%s", sharded.plan, extra=FILE_ONLY)
    return sharded


def train_batches(
    cfg: Config,
    data: RetrievalData,
    layout: FeatureLayout,
    env: DistEnv,
    example_counts: list[int] | None,
    loader: str | None = None,
) -> TrainBatches:
    """This rank's share of every epoch's seeded global batches (``example_counts``: ``RunData``'s), built where
    ``loader`` (default trainer.loader; "auto" = "device") says: on the training device, or on the host."""
    on_device = (loader or cfg.trainer.loader) != "host"
    return TrainBatches(
        data,
        history_length=cfg.data.history_length,
        global_batch_size=cfg.trainer.global_batch_size,
        num_negatives=cfg.model.negatives.num,
        negative_exponent=cfg.model.negatives.exponent,
        seed=cfg.trainer.seed,
        query_history=cfg.data.query_history,
        history_dropout=cfg.data.history_dropout,
        layout=layout,
        rank=env.rank,
        world_size=env.world_size,
        pin_memory=not on_device and env.device.type == "cuda",  # built (and pinned) on the prefetch thread
        rank_example_counts=example_counts,
        equal_shares=cfg.model.id_mapping == IdMapping.managed,
        device=env.device if on_device else None,
    )


def run_evaluator(cfg: Config, data: RetrievalData, layout: FeatureLayout) -> Evaluator:
    """The run's evaluator: the two-tower's validation each epoch (eval.valid_metric picks the best epoch) and the
    evaluation stage's embeddings of valid and test."""
    return Evaluator(
        data,
        FeatureBuilder(data, layout=layout),
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
        chunk_size=cfg.eval.chunk_size,
        per_rank_users=cfg.data.shard_by_user,
    )
