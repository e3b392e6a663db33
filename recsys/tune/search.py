"""The budgeted search on valid, then the chosen settings trained as the run.

    $ python -m recsys.train +experiment=movielens tune.budget_minutes=20

The first trial trains the settings as configured (each knob's own value, where its range holds it), so the chosen
settings are never below them on valid; Optuna (TPE, seeded by ``tune.seed``) proposes the others' values of
``tune.space``. A trial trains them in ``<run dir>/tune/trial_<n>/`` with the per-epoch validation and early stopping
(recsys.run.search_trial: the test split is never read), and its figure is its best epoch's valid
``eval.valid_metric``. A trial whose figure after an epoch (its 2nd on) is below the median of the earlier trials' at
that epoch is pruned there (``tune.prune``) and never chosen. The best trial replaces the configured settings only
when ahead of them on valid by more than ``tune.min_gain_se`` standard errors of that lead, paired over the valid
users, times sqrt(2 ln N) for the best of N trials (recsys/tune/trials_table.py). A trial that would not end within
the budget is not started (the longest so far is the estimate); a trial running past it stops after its current
epoch, keeping its best so far. Where the run will refit on train + valid (trainer.refit, recsys/refit_rule.py), the
first trial's seconds are kept out of the budget for that second training. The chosen settings are then trained as a
normal run in the run dir (results.json, the evaluation stage, the bundle), whose rankers tune their own grids on
valid as always; the trials' table goes to
``tune/trials.json`` and ``tune/trials.md``. A run dir whose search and training are done is not
searched again: the same command reports it.

Under torchrun every trial trains on all the ranks, as the run does (one process group for the whole search): rank 0
decides what each rank does next (start a trial or not, its settings, pruning) and broadcasts it, so that ranks whose
clocks differ by a few milliseconds never disagree.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from recsys.config import Config, with_values
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.refit_rule import decide_refit
from recsys.rundir.dir import RESULTS_FILE
from recsys.tune.space import configured, describe, suggest
from recsys.tune.trials_table import TUNE_DIR, Trial, best_trial, chosen_trial, write_trials

log = logging.getLogger(__name__)

# (config, trial dir, deadline, on_epoch) -> the training's results; on_epoch(epoch, valid figure) -> stop there
TrainTrial = Callable[[Config, Path, float, Callable[[int, float], bool] | None], dict]
Sync = Callable[[Any], Any]  # rank 0's value of its argument, on every rank


def _one_process(value: Any) -> Any:
    return value


def _from_rank0(value: Any) -> Any:
    import torch.distributed as dist  # noqa: PLC0415

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def search(
    cfg: Config,
    run_dir: Path,
    train_trial: TrainTrial,
    clock: Callable[[], float] = time.monotonic,
    sync: Sync = _one_process,
) -> list[Trial]:
    """The trials of ``cfg.tune`` (module docstring), in order; ``sync``: rank 0's decisions on every rank."""
    import optuna  # noqa: PLC0415 (only a search needs it)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune = cfg.tune
    budget_s = 60.0 * float(tune.budget_minutes)
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=tune.prune_after_trials, n_warmup_steps=1)
        if tune.prune
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=tune.seed), pruner=pruner)
    study.enqueue_trial(configured(cfg, tune.space))  # trial 0: the settings as configured (the search's floor)
    start, trials, reserve = clock(), [], None
    while not tune.max_trials or len(trials) < tune.max_trials:
        elapsed, longest = clock() - start, max((t.seconds for t in trials), default=0.0)
        if sync(elapsed + longest > budget_s or elapsed >= budget_s):
            log.info(
                "tune: %.0f s of %.0f s spent; the next trial (up to %.0f s) is not started", elapsed, budget_s, longest
            )
            break
        proposal = study.ask()
        values = sync({knob.key: suggest(proposal, knob) for knob in tune.space})
        trial, counts = sync(_run_trial(
            cfg, run_dir, len(trials), values, train_trial, deadline=start + budget_s, clock=clock,
            proposal=proposal, sync=sync,
        ))  # fmt: skip
        trials.append(trial)
        _keep_compared_figures(trials)
        if reserve is None:  # trial 0 is the configured training: what the run's refit, if any, will about cost
            reserve = _refit_reserve(cfg, trial, counts)
            budget_s -= reserve
        if trial.valid is None:
            study.tell(proposal, state=optuna.trial.TrialState.FAIL)
        elif trial.state.startswith("pruned"):
            study.tell(proposal, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(proposal, trial.valid)
    return trials


def _keep_compared_figures(trials: list[Trial]) -> None:
    """Only trial 0's and the best trial's users' figures are ever compared (chosen_trial): the others' are dropped,
    so that a long search over 10^6 valid users holds two arrays, not one per trial."""
    best = best_trial(trials)
    for trial in trials[1:]:
        if trial is not best:
            trial.per_user = None


class _PruningHook:
    """The trainer's ``on_epoch`` for a trial: reports each epoch's valid figure to Optuna and stops the training
    when the study's pruner says the trial is behind (``pruned_at``: that epoch)."""

    def __init__(self, proposal, epochs: int, sync: Sync) -> None:
        self.proposal, self.epochs, self.sync, self.pruned_at = proposal, epochs, sync, None

    def __call__(self, epoch: int, score: float) -> bool:
        self.proposal.report(score, epoch)
        # after the last epoch it would save nothing; every rank stops where rank 0's pruner says
        if self.sync(epoch + 1 < self.epochs and self.proposal.should_prune()):
            self.pruned_at = epoch
        return self.pruned_at is not None


def _refit_reserve(cfg: Config, first: Trial, counts: Mapping[str, int] | None) -> float:
    """Seconds of the budget kept for the run's refit (trainer.refit, recsys/refit_rule.py): the first trial's, so
    that the search, the run and its refit take about the budget and one training."""
    if counts is None or not decide_refit(cfg, counts.get("train", 0), counts.get("valid", 0))[0]:
        return 0.0
    log.info("tune: the run will refit on train + valid: %.0f s of the budget (trial 0's) kept for it", first.seconds)
    return first.seconds


def _run_trial(
    cfg, run_dir, number, values, train_trial, *, deadline: float, clock, proposal, sync
) -> tuple[Trial, dict | None]:
    """The trial and its dataset's split counts (None where the training did not say)."""
    trial_cfg = trial_config(cfg, values)
    pruning = _PruningHook(proposal, trial_cfg.trainer.epochs, sync)
    trial_dir = run_dir / TUNE_DIR / f"trial_{number}"
    began = clock()
    log.info("tune: trial %d: %s", number, ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
    counts = per_user = None
    try:
        results = train_trial(trial_cfg, trial_dir, deadline, pruning)
        trained, counts = results["train"], results.get("dataset", {}).get("counts")
        per_user = results.get("valid_users")  # (users, figures) of its best epoch: the paired comparison
        valid, best_epoch = trained.get("best_valid"), int(trained.get("best_epoch", -1))
        state = "stopped at the budget" if clock() > deadline else "complete"
        if pruning.pruned_at is not None:
            state = f"pruned at epoch {pruning.pruned_at}"
    except (FloatingPointError, RuntimeError, ValueError) as e:  # a setting that diverges or cannot run
        valid, best_epoch, state = None, -1, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    shutil.rmtree(trial_dir / "checkpoints", ignore_errors=True)  # its weights are not kept: the run retrains the best
    seconds = clock() - began
    log.info("tune: trial %d: valid %s, %.0f s (%s)", number, _fmt(valid), seconds, state)
    users = min(counts.get("users", 0), counts.get("valid", 0)) if counts else 0  # each valid user has a valid row
    return Trial(number, values, valid, seconds, state, best_epoch, users, per_user), counts


def trial_config(cfg: Config, values: Mapping[str, Any]) -> Config:
    """The config a trial trains: ``cfg`` with ``values``, its own epoch cap, fresh (no resume), no refit."""
    cfg = with_values(cfg, dict(values))
    trainer = replace(
        cfg.trainer, epochs=cfg.tune.trial_epochs or cfg.trainer.epochs, resume="none", refit=False, progress_bar=False
    )
    return replace(cfg, trainer=trainer)


def chosen_config(cfg: Config, trials: list[Trial]) -> tuple[Config, Trial | None, str]:
    """The run's config: ``cfg`` with the chosen trial's values (``chosen_trial``: the best on valid unless within
    tune.min_gain_se of the configured settings; as given when no trial completed), that trial and why."""
    best, why = chosen_trial(trials, cfg.tune.min_gain_se)
    return (cfg if best is None else with_values(cfg, best.values)), best, why


def tune_and_fit(
    cfg: Config, run_dir: Path, fit: Callable, train_trial: TrainTrial, record: dict | None = None
) -> dict:
    """The search, then ``fit`` of the chosen config in ``run_dir`` (with ``record``, the run's .hydra/ files, its
    config.yaml the one trained); the trials' table into ``run_dir/tune/``. Under torchrun, on every rank: one
    process group for the trials and the run (module docstring)."""
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend) if _world_size() > 1 else None
    try:
        return _tune_and_fit(cfg, run_dir, fit, train_trial, record, _from_rank0 if env else _one_process)
    finally:
        if env is not None:
            destroy_distributed(env)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _tune_and_fit(cfg, run_dir: Path, fit: Callable, train_trial: TrainTrial, record, sync: Sync) -> dict:
    done = run_dir / TUNE_DIR / "trials.json"
    if done.is_file() and (run_dir / RESULTS_FILE).is_file():  # searched and trained: reported, not searched again
        values = json.loads(done.read_text()).get("values") or {}
        return fit(with_values(cfg, values), run_dir, record)
    log.info("tune: %g minutes on valid %s over %s", cfg.tune.budget_minutes, cfg.eval.valid_metric,
             "; ".join(describe(k) for k in cfg.tune.space))  # fmt: skip
    began = time.monotonic()
    trials = search(cfg, run_dir, train_trial, sync=sync)
    final, best, why = chosen_config(cfg, trials)
    summary = {
        "metric": cfg.eval.valid_metric,
        "budget_minutes": cfg.tune.budget_minutes,
        "seconds": time.monotonic() - began,
        "chosen": None if best is None else best.number,
        "why": why,
        "values": None if best is None else best.values,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        write_trials(run_dir, trials, summary)
    if best is not None:
        log.info("tune: %s (valid %.4f): %s", why, best.valid, best.values)
    if record is not None:
        record = {**record, "config.yaml": OmegaConf.to_yaml(OmegaConf.structured(final))}
    return fit(final, run_dir, record)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
