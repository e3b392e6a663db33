"""Assembling a run from its config: the one module every entry point goes through.

    prepare_dataset_on_rank0   rank 0 prepares (or finds) the dataset dir, every rank gets its path
    load_data                  the whole dataset, or this rank's users only (data.shard_by_user)
    shard_for_training         build_task -> shard_model with the run's optimizers, pretrained / frozen tables
    load_trained               a finished run's weights on this job's ranks (any world size), for inference
    fit / evaluate_run         what ``recsys.train`` and ``recsys.evaluate`` run (``recsys.export``'s: run_export.py)

Each operation opens the process group, does its work and closes the group (the sharded model
is released first: torchrec's threads otherwise abort the exit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch.distributed as dist

from data_pipelines.prepare import prepare_dataset
from recsys.atomic import write_json_atomic
from recsys.config import (
    Config,
    DataConfig,
    EvaluateConfig,
    IdMapping,
    SparseOptimConfig,
)  # fmt: skip
from recsys.data.batch_bounds import ceil_div
from recsys.data.batches import TrainBatches
from recsys.data.dataset import RetrievalData, load_dataset, with_valid_in_train
from recsys.data.feature_builder import run_feature_builder
from recsys.data.layout import run_layout
from recsys.data.neighbors import with_item_neighbors
from recsys.data.raw_ids import with_raw_ids
from recsys.data.side_features import with_side_features
from recsys.data.slices import with_slice
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.plan_summary import plan_summary
from recsys.distributed.rank_data import load_rank_data, rank_user_range
from recsys.distributed.sharding import ShardedModel, inference_sharding, shard_model
from recsys.evaluation.offline import check_splits, evaluate_trained
from recsys.evaluation.run_stage import plan_run_stage, rank_after_training, stage_resources, with_plan
from recsys.evaluation.sharded import Evaluator
from recsys.logs import FILE_ONLY
from recsys.model.build import build_task
from recsys.rankers.plugins import load_plugins
from recsys.rankers.registry import check_rankers, check_resources, serve_candidates
from recsys.refit_rule import decide_refit
from recsys.run_checks import (
    check_batch_fits,
    check_evaluate_names,
    note_dropped_rows,
    warn_ks_beyond_catalogue,
)
from recsys.rundir.checkpoint import load_checkpoint
from recsys.rundir.config import checkpoint_dir, load_run_config
from recsys.rundir.dir import RESULTS_FILE, check_finished_evaluation, result_ks
from recsys.rundir.lock import lock_run_dir, reading_run_dir
from recsys.rundir.manager import CheckpointManager
from recsys.rundir.outputs import format_results_table
from recsys.rundir.record import write_run_record
from recsys.rundir.results import split_counts
from recsys.trainer import Trainer

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


def shard_for_training(cfg: Config, data: RetrievalData, env: DistEnv) -> ShardedModel:
    """Collective: the run's model for ``data``, planned, sharded and initialised, with its optimizers."""
    sharded = shard_model(
        build_task(cfg, data),
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


def fit(cfg: Config, run_dir: str | Path, record: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Train, validate each epoch, restore the best epoch, rank valid and test with the configured rankers (then,
    with trainer.refit, train again on train + valid and rank test with the points valid chose); returns what
    results.json holds. ``record``: the run's ``.hydra/`` files (name -> YAML text), written once the run trains
    or evaluates (recsys/rundir/record.py); a run refused, or already complete, leaves the run dir's as they were."""
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend)
    lock = None
    try:
        lock = lock_run_dir(Path(run_dir), env)  # a second training in this run dir fails here, naming the owner
        load_plugins(cfg.eval.plugins)  # their rankers registered before the names are checked
        check_rankers(cfg)  # a typo or a bad setting fails now, not after training
        check_finished_evaluation(cfg, Path(run_dir))  # a finished run asked for other eval.*: refused, naming them
        results = _train_and_test(cfg, Path(run_dir), env, record=record)
        counts = results.get("dataset", {}).get("counts", {})
        if decide_refit(cfg, counts.get("train", 0), counts.get("valid", 0))[0]:
            refit_cfg = refit_config(cfg, results["train"]["best_epoch"], results["headline"]["ranker"])
            if "evaluation_plan" in results:  # the rankers and settings the selection stage planned
                refit_cfg = with_plan(refit_cfg, results["evaluation_plan"])
            chosen = {name: row["point"] for name, row in results.get("rankers", {}).items()}
            if env.is_main:
                log.info(
                    "trainer.refit: a fresh model on train + valid for %d epochs (the best epoch + 1) in %s",
                    refit_cfg.trainer.epochs,
                    Path(run_dir) / REFIT_DIR,
                )
            refit = _train_and_test(refit_cfg, Path(run_dir) / REFIT_DIR, env, chosen=chosen)
            results = {**results, "refit": refit}
            if env.is_main:
                write_json_atomic(Path(run_dir) / RESULTS_FILE, results)
        return results
    finally:
        if lock is not None:
            lock.release()
        destroy_distributed(env)


def search_trial(
    cfg: Config, run_dir: str | Path, deadline: float | None = None, on_epoch: Callable | None = None
) -> dict[str, Any]:
    """One trial of a search (recsys/tune/): train ``cfg`` in ``run_dir`` with the per-epoch validation and early
    stopping, no evaluation stage (the test split is never read); returns the training's results ("train":
    best_valid, best_epoch, seconds; "valid_users": (the valid users, the best epoch's figure of each)).
    ``deadline`` and ``on_epoch`` (the pruner's hook): the Trainer's."""
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend)
    lock = None
    try:
        lock = lock_run_dir(Path(run_dir), env)
        return _train_and_test(cfg, Path(run_dir), env, stage=False, deadline=deadline, on_epoch=on_epoch)
    finally:
        if lock is not None:
            lock.release()
        destroy_distributed(env)


REFIT_DIR = "refit"  # <run dir>/refit: trainer.refit's second stage, a run dir of its own


def refit_config(cfg: Config, best_epoch: int, served: str = "") -> Config:
    """The second stage of trainer.refit: the same data and model, the valid rows trained on, for the
    selected number of epochs, from scratch (the rankers' points come from the selection stage: ``fit``; so does
    ``served``, the ranker it served, there being no valid split to choose on)."""
    if best_epoch < 0:
        raise ValueError("trainer.refit: the selection stage recorded no best epoch")
    # a resume path names a checkpoint of the selection stage: the refit continues its own, if any
    resume = cfg.trainer.resume if cfg.trainer.resume in ("auto", "none") else "auto"
    trainer = replace(
        cfg.trainer, refit=False, epochs=best_epoch + 1, early_stopping_patience=0, init_from="", resume=resume
    )
    # the learning-rate schedule's horizon stays the selection stage's: the refit replays its curve
    optim = replace(cfg.optim, schedule_epochs=cfg.optim.schedule_epochs or cfg.trainer.epochs)
    evaluation = replace(cfg.eval, serve=served or cfg.eval.serve)
    return replace(cfg, data=replace(cfg.data, train_on_valid=True), trainer=trainer, optim=optim, eval=evaluation)


def train_batches(
    cfg: Config, data: RetrievalData, env: DistEnv, example_counts: list[int] | None, loader: str | None = None
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
        layout=run_layout(cfg, data),
        rank=env.rank,
        world_size=env.world_size,
        pin_memory=not on_device and env.device.type == "cuda",  # built (and pinned) on the prefetch thread
        rank_example_counts=example_counts,
        equal_shares=cfg.model.id_mapping == IdMapping.managed,
        device=env.device if on_device else None,
    )


def run_evaluator(cfg: Config, data: RetrievalData) -> Evaluator:
    """The run's evaluator: the two-tower's validation each epoch (eval.valid_metric picks the best epoch) and the
    evaluation stage's embeddings of valid and test."""
    return Evaluator(
        data,
        run_feature_builder(cfg, data),
        ks=cfg.eval.ks,
        batch_size=cfg.eval.batch_size,
        chunk_size=cfg.eval.chunk_size,
        per_rank_users=cfg.data.shard_by_user,
    )


def _train_and_test(
    cfg: Config,
    run_dir: Path,
    env: DistEnv,
    chosen: dict | None = None,
    record: Mapping[str, str] | None = None,
    *,
    stage: bool = True,
    deadline: float | None = None,
    on_epoch: Callable | None = None,
) -> dict[str, Any]:
    """Train (``Trainer``), then the evaluation stage on the best epoch's weights; writes results.json (and
    ``record``, the run's .hydra/ files, once it is to train or evaluate). ``stage=False`` (a search's trial): the
    training alone, validated each epoch, no test ranked, no results.json; ``deadline``, ``on_epoch``: the
    Trainer's."""
    sharded: ShardedModel | None = None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        data, example_counts = load_data(cfg, env)
        num_examples = len(data.example_rows()) if example_counts is None else sum(example_counts)
        check_batch_fits(cfg.trainer.global_batch_size, num_examples, data.dir)  # before the model is built
        if env.is_main and stage and cfg.trainer.refit is None and not cfg.data.train_on_valid:
            counts = split_counts(data)
            log.info("%s", decide_refit(cfg, counts["train"], counts.get("valid", 0))[1])
        resources = stage_resources(cfg, data)
        stage_cfg, plan = plan_run_stage(cfg, resources)  # the default list fitted to this host, once
        if env.is_main and stage:
            plan.log(log, resources.throughput.threads)
            candidates = serve_candidates(stage_cfg, data.num_items)
            log.info(
                "evaluation stage: rankers %s; the headline and the bundle: %s",
                ", ".join(plan.names),
                candidates[0] if len(candidates) == 1 else f"the best on valid of {', '.join(candidates)}",
            )
        # a ranker whose fit the host cannot hold is refused now, not after training
        check_resources(stage_cfg, resources)
        sharded = shard_for_training(cfg, data, env)
        if env.is_main:
            warn_ks_beyond_catalogue(cfg.eval.ks, data.num_items, "eval.ks")
        checkpoints = CheckpointManager(cfg, run_dir, env, sharded, data)
        start = checkpoints.start()
        if start.finished is not None:  # a finished run is not trained again, nor its record rewritten
            if env.is_main:
                print(format_results_table(start.finished, result_ks(start.finished)), flush=True)
            return start.finished
        if record and env.is_main:
            write_run_record(run_dir, record)
        batches, evaluator = train_batches(cfg, data, env, example_counts), run_evaluator(cfg, data)
        trainer = Trainer(
            cfg, run_dir, env, data, sharded, checkpoints=checkpoints, batches=batches, evaluator=evaluator,
            deadline=deadline, on_epoch=on_epoch, keep_valid_users=not stage,
        )  # fmt: skip
        trained = trainer.fit(start.resume_from)
        if not stage:  # a search's trial: its best epoch's figure of each valid user, to compare trials user by user
            return {**trained, "valid_users": trainer.best_valid_users}
        ranked = rank_after_training(
            stage_cfg, env, data, trainer.two_tower, run_dir, evaluator, chosen=chosen, estimate=plan.estimate
        )
        headline = ranked.pop("headline")
        results = {
            "test": ranked["test"],
            "valid": ranked["valid"],
            "headline": {**headline, "test": ranked["test"][headline["ranker"]]},
            "rankers": ranked["rankers"],
            "untrained": ranked["untrained"],
            "evaluation_plan": plan.describe(),
            **trained,
        }
        if env.is_main:
            write_json_atomic(run_dir / RESULTS_FILE, results)
            print(format_results_table(results, cfg.eval.ks), flush=True)
        return results
    finally:
        del sharded  # before the group goes: torchrec's threads otherwise abort the exit


class TrainedRun(NamedTuple):
    data: RetrievalData
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
    task = build_task(cfg, data, item_counts=np.ones(data.num_items, dtype=np.int64))
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
    return TrainedRun(data, sharded, path)


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
        return evaluate_trained(ecfg, cfg, run_dir, env, trained.data, trained.sharded, trained.checkpoint)
    finally:
        del trained
        destroy_distributed(env)
