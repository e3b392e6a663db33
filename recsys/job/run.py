"""The run: one training and its evaluation stage, as ``recsys.train`` runs it (with trainer.refit a second training
on train + valid), and a search's trial (recsys/tune/). The pieces come from assemble.py; a finished run is read
back by trained.py (``recsys.evaluate``) and serving/export_run.py (``recsys.export``).

Each operation opens the process group, does its work and closes the group (the sharded model is released first:
torchrec's threads otherwise abort the exit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from recsys.config import Config
from recsys.config.fingerprint import config_fingerprint, run_identity
from recsys.data.dataset import RetrievalData
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.job.assemble import load_data, run_evaluator, shard_for_training, train_batches
from recsys.job.checks import (
    check_batch_fits,
    warn_ks_beyond_catalogue,
)
from recsys.job.plan import RunPlan, resolve_plan
from recsys.job.ranker_choice import check_rankers, check_resources
from recsys.job.run_stage import rank_after_training, trial_figure, with_plan
from recsys.job.trained import REFIT_DIR
from recsys.rankers.plugins import load_plugins
from recsys.rundir.dir import RESULTS_FILE, check_finished_evaluation, result_ks
from recsys.rundir.lock import lock_run_dir
from recsys.rundir.manager import CheckpointManager
from recsys.rundir.outputs import format_results_table
from recsys.rundir.record import write_run_record
from recsys.training.trainer import Trainer
from recsys.utils.atomic import write_json_atomic

log = logging.getLogger(__name__)


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
        # a finished run asked for other eval.*: refused, naming them
        check_finished_evaluation(Path(run_dir), cfg.trainer, cfg.eval, config_fingerprint(cfg))
        results, plan = _train_and_test(cfg, Path(run_dir), env, record=record)
        if plan.refit:
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
            refit = _train_and_test(refit_cfg, Path(run_dir) / REFIT_DIR, env, chosen=chosen)[0]
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
        return _train_trial(cfg, Path(run_dir), env, deadline, on_epoch)
    finally:
        if lock is not None:
            lock.release()
        destroy_distributed(env)


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


class _Opened(NamedTuple):
    """A training's dataset and what the run decided over it before the model is built."""

    data: RetrievalData
    example_counts: list[int] | None  # every rank's training examples when each holds its own users; else None
    plan: RunPlan


def _open(cfg: Config, run_dir: Path, env: DistEnv) -> _Opened:
    """Collective: the dataset, the batch checked against it, and the run's plan (recsys/job/plan.py), logged once
    on rank 0."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data, example_counts = load_data(cfg, env)
    num_examples = len(data.example_rows()) if example_counts is None else sum(example_counts)
    check_batch_fits(cfg.trainer.global_batch_size, num_examples, data.dir)  # before the model is built
    plan = resolve_plan(cfg, data)
    if env.is_main:
        plan.log(log)
    return _Opened(data, example_counts, plan)


def _trainer(cfg: Config, run_dir: Path, env: DistEnv, opened: _Opened, record, **hooks) -> tuple[Trainer | None, Any]:
    """Collective: (the Trainer of the sharded model, where to resume), or (None, the results) of a run already
    finished, which is not trained again nor its record rewritten. ``hooks``: the Trainer's deadline, on_epoch and
    keep_valid_users."""
    plan, data = opened.plan, opened.data
    check_resources(plan.stage_cfg, plan.resources)  # a fit the host cannot hold is refused now, not after training
    sharded = shard_for_training(cfg, data, plan.layout, env)
    if env.is_main:
        warn_ks_beyond_catalogue(cfg.eval.ks, data.num_items, "eval.ks")
    checkpoints = CheckpointManager(cfg.trainer, run_identity(cfg), run_dir, env, sharded, data)
    start = checkpoints.start()
    if start.finished is not None:
        if env.is_main:
            print(format_results_table(start.finished, result_ks(start.finished)), flush=True)
        return None, start.finished
    if record and env.is_main:
        write_run_record(run_dir, record)
    batches = train_batches(cfg, data, plan.layout, env, opened.example_counts)
    evaluator = run_evaluator(cfg, data, plan.layout)
    trainer = Trainer(
        cfg.trainer, run_dir, env, data, sharded, optim=cfg.optim, valid_metric=cfg.eval.valid_metric,
        checkpoints=checkpoints, batches=batches, evaluator=evaluator, **hooks,
    )  # fmt: skip
    return trainer, start.resume_from


def _train_and_test(
    cfg: Config, run_dir: Path, env: DistEnv, chosen: dict | None = None, record: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], RunPlan]:
    """(results, the run's plan): train (``Trainer``), then the evaluation stage on the best epoch's weights; writes
    results.json, unless a refit follows (``fit`` writes it once, with the refit's results: a run dir never holds a
    results.json that a reader could take for the finished run's), and ``record``, the run's .hydra/ files, once it
    is to train or evaluate."""
    opened = _open(cfg, run_dir, env)
    plan = opened.plan
    trainer, resume_from = _trainer(cfg, run_dir, env, opened, record)
    if trainer is None:
        return resume_from, plan  # the finished run's results
    trained = trainer.fit(resume_from)
    ranked = rank_after_training(
        plan.stage_cfg, env, opened.data, trainer.two_tower, run_dir, trainer.evaluator, chosen=chosen,
        estimate=plan.stage.estimate,
    )  # fmt: skip
    headline = ranked.pop("headline")
    results = {
        "test": ranked["test"],
        "valid": ranked["valid"],
        "headline": {**headline, "test": ranked["test"][headline["ranker"]]},
        "rankers": ranked["rankers"],
        "untrained": ranked["untrained"],
        "evaluation_plan": plan.stage.describe(),
        **trained,
    }
    if env.is_main:
        if not plan.refit:
            write_json_atomic(run_dir / RESULTS_FILE, results)
        print(format_results_table(results, cfg.eval.ks), flush=True)
    return results, plan


def _train_trial(
    cfg: Config, run_dir: Path, env: DistEnv, deadline: float | None, on_epoch: Callable | None
) -> dict[str, Any]:
    """A search's trial: the training alone, validated each epoch, no test ranked, no results.json; its best epoch's
    figure of each valid user (trials are compared user by user) and, where it is a candidate for the choice, the
    valid figure of what its run would serve (a fusion, by default)."""
    opened = _open(cfg, run_dir, env)
    trainer, resume_from = _trainer(
        cfg, run_dir, env, opened, None, deadline=deadline, on_epoch=on_epoch, keep_valid_users=True
    )
    if trainer is None:
        return resume_from  # a trial dir with a finished run (never made by a search: each trial starts afresh)
    trained = trainer.fit(resume_from)
    candidate = trainer.finished and not trainer.pruned
    served = (
        trial_figure(opened.plan.stage_cfg, env, opened.data, trainer.two_tower, trainer.evaluator)
        if candidate
        else None
    )
    return {**trained, "valid_users": trainer.best_valid_users, "finished": trainer.finished, "served": served}
