"""The budgeted search on valid, then the chosen settings trained as the run.

    $ python -m recsys.train +experiment=movielens tune.budget_minutes=20

The first trial trains the settings exactly as configured (a knob's value outside its range too), so the chosen
settings are never below them on valid; Optuna (TPE, seeded by ``tune.seed``) proposes the others' values of
``tune.space``. A trial trains them in ``<run dir>/tune/trial_<n>/`` with the per-epoch validation and early stopping
(recsys.job.run.search_trial: the test split is never read), and its figure is the valid ``eval.valid_metric`` of what
its run would serve: the two-tower's best epoch, or where the run serves the best on valid of several rankers (the
default's fusion with the graph filter) that one's, each at its grid's best point, as the run's evaluation stage
chooses (recsys.job.run_stage.trial_figure; the graph filter's and EASE's fits are made once for the whole
search). A trial whose two-tower figure after an epoch (its 2nd on) is below the median of the earlier trials' at
that epoch is pruned there (``tune.prune``) and never chosen. The best trial replaces the configured settings only
when ahead of them on valid by more than ``tune.min_gain_se`` standard errors of that lead, paired over the valid
users, times sqrt(2 ln N) for the best of N trials (recsys/tune/trials_table.py). A trial that would not end within
the budget is not started (the longest so far is the estimate); a trial running past it stops after its current
epoch and is never chosen (its settings were not trained out); when no trial completes, the run trains the settings
as configured and says so. Where the run will refit on train + valid (trainer.refit, recsys/job/refit_rule.py), the
first trial's seconds are kept out of the budget for that second training. The chosen settings are then trained as a
normal run in the run dir (results.json, the evaluation stage, the bundle), whose rankers tune their own grids on
valid as always; the trials' table goes to
``tune/trials.json`` and ``tune/trials.md``. A run dir whose search and training are done is not
searched again: the same command reports it.

Under torchrun every trial trains on all the ranks, as the run does (one process group for the whole search): rank 0
decides what each rank does next (start a trial or not, its settings, pruning) and broadcasts it, so that ranks whose
clocks differ by a few milliseconds never disagree. With ``tune.parallel_trials`` each rank trains a trial of its own
at once instead, alone on its device (recsys/tune/per_rank.py), where the tables fit one device.
"""

from __future__ import annotations

import logging
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from recsys.config import Config, with_values
from recsys.job.refit_rule import decide_refit
from recsys.ranking.scoring import TRAINED_ROW
from recsys.rundir.preemption import Preempted
from recsys.tune.space import configured, trial_values
from recsys.tune.trials_table import COMPLETE, TUNE_DIR, Trial, best_trial, chosen_trial

log = logging.getLogger(__name__)

# a stop inside a search: its trials are not stored yet, so a rerun searches again from trial 0
SEARCH_RESTARTS = (
    "the search was at trial {trial}; the same command starts the search again from trial 0 (its finished trials "
    "are trained again), then trains the chosen settings"
)

# (config, trial dir, deadline, on_epoch) -> the training's results; on_epoch(epoch, valid figure) -> stop there
TrainTrial = Callable[[Config, Path, float, Callable[[int, float], bool] | None], dict]
Sync = Callable[[Any], Any]  # rank 0's value of its argument, on every rank


def one_process(value: Any) -> Any:
    return value


def from_rank0(value: Any) -> Any:
    import torch.distributed as dist  # noqa: PLC0415

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def search(
    cfg: Config,
    run_dir: Path,
    train_trial: TrainTrial,
    clock: Callable[[], float] = time.monotonic,
    sync: Sync = one_process,
) -> list[Trial]:
    """The trials of ``cfg.tune`` (module docstring), in order; ``sync``: rank 0's decisions on every rank."""
    tune = cfg.tune
    budget_s = 60.0 * float(tune.budget_minutes)
    study = new_study(cfg)
    start, trials, reserve = clock(), [], None
    while not tune.max_trials or len(trials) < tune.max_trials:
        elapsed, longest = clock() - start, max((t.seconds for t in trials), default=0.0)
        if sync(elapsed + longest > budget_s or elapsed >= budget_s):
            log.info(
                "tune: %.0f s of %.0f s spent; the next trial (up to %.0f s) is not started", elapsed, budget_s, longest
            )
            break
        proposal = study.ask()
        values = sync(trial_values(proposal, cfg, tune.space, len(trials)))
        try:
            trial, counts, _ = sync(run_trial(
                cfg, run_dir, len(trials), values, train_trial, deadline=start + budget_s, clock=clock,
                proposal=proposal, sync=sync,
            ))  # fmt: skip
        except Preempted as e:  # the study is not stored: say what the same command will do
            raise Preempted(e.step, e.checkpoint, e.signum, then=SEARCH_RESTARTS.format(trial=len(trials))) from None
        trials.append(trial)
        keep_compared_figures(trials)
        if reserve is None:  # trial 0 is the configured training: what the run's refit, if any, will about cost
            reserve = refit_reserve(cfg, trial, counts)
            budget_s -= reserve
        tell(study, proposal, trial)
    return trials


def new_study(cfg: Config, parallel: bool = False):
    """The Optuna study of ``cfg.tune``: TPE seeded by tune.seed (``parallel``: with the constant liar, so that
    the proposals asked for at once, before any is told, are spread apart), the median pruner (tune.prune), and
    trial 0 the settings as configured (the search's floor)."""
    import optuna  # noqa: PLC0415 (only a search needs it)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tune = cfg.tune
    with warnings.catch_warnings():  # constant_liar is "experimental" in Optuna 4: it is the documented way to ask
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # for several proposals at once
        sampler = optuna.samplers.TPESampler(seed=tune.seed, constant_liar=parallel)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=new_pruner(tune))
    study.enqueue_trial(configured(cfg, tune.space))
    return study


def new_pruner(tune):
    """Optuna's median pruner from a trial's 2nd epoch once tune.prune_after_trials trials have ended, or none."""
    import optuna  # noqa: PLC0415

    if not tune.prune:
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=tune.prune_after_trials, n_warmup_steps=1)


def tell(study, proposal, trial: Trial) -> None:
    """The trial's outcome into the study: failed, pruned or its valid figure."""
    from optuna.trial import TrialState  # noqa: PLC0415

    if trial.valid is None:
        study.tell(proposal, state=TrialState.FAIL)
    elif trial.state.startswith("pruned"):
        study.tell(proposal, state=TrialState.PRUNED)
    else:
        study.tell(proposal, trial.valid)


def keep_compared_figures(trials: list[Trial]) -> None:
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
        self.reports: dict[int, float] = {}  # epoch -> valid figure, as reported

    def __call__(self, epoch: int, score: float) -> bool:
        self.proposal.report(score, epoch)
        self.reports[epoch] = score
        # after the last epoch it would save nothing; every rank stops where rank 0's pruner says
        if self.sync(epoch + 1 < self.epochs and self.proposal.should_prune()):
            self.pruned_at = epoch
        return self.pruned_at is not None


def refit_reserve(cfg: Config, first: Trial, counts: Mapping[str, int] | None) -> float:
    """Seconds of the budget kept for the run's refit (trainer.refit, recsys/job/refit_rule.py): the first trial's, so
    that the search, the run and its refit take about the budget and one training."""
    if counts is None or not decide_refit(cfg, counts.get("train", 0), counts.get("valid", 0))[0]:
        return 0.0
    log.info("tune: the run will refit on train + valid: %.0f s of the budget (trial 0's) kept for it", first.seconds)
    return first.seconds


def run_trial(
    cfg, run_dir, number, values, train_trial, *, deadline: float, clock, proposal, sync
) -> tuple[Trial, dict | None, dict[int, float]]:
    """The trial, its dataset's split counts (None where the training did not say) and its valid figure of each
    epoch reported to the pruner."""
    trial_cfg = trial_config(cfg, values)
    pruning = _PruningHook(proposal, trial_cfg.trainer.epochs, sync)
    trial_dir = run_dir / TUNE_DIR / f"trial_{number}"
    began = clock()
    log.info("tune: trial %d: %s", number, ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))
    counts = per_user = None
    served_by = TRAINED_ROW
    try:
        results = train_trial(trial_cfg, trial_dir, deadline, pruning)
        trained, counts = results["train"], results.get("dataset", {}).get("counts")
        per_user = results.get("valid_users")  # (users, figures) of its best epoch: the paired comparison
        valid, best_epoch = trained.get("best_valid"), int(trained.get("best_epoch", -1))
        if results.get("served"):  # the figure of what its run would serve (a fusion), not the two-tower's alone
            served = results["served"]
            valid, per_user, served_by = served["valid"], served["users"], served["ranker"]
        state = COMPLETE if results.get("finished", clock() <= deadline) else "stopped at the budget"
        if pruning.pruned_at is not None:
            state = f"pruned at epoch {pruning.pruned_at}"
    except (FloatingPointError, RuntimeError, ValueError) as e:  # a setting that diverges or cannot run
        valid, best_epoch, state = None, -1, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    shutil.rmtree(trial_dir / "checkpoints", ignore_errors=True)  # its weights are not kept: the run retrains the best
    seconds = clock() - began
    log.info("tune: trial %d: valid %s of %s, %.0f s (%s)", number, _fmt(valid), served_by, seconds, state)
    users = min(counts.get("users", 0), counts.get("valid", 0)) if counts else 0  # each valid user has a valid row
    trial = Trial(number, values, valid, seconds, state, best_epoch, users, served=served_by, per_user=per_user)
    return trial, counts, pruning.reports


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
    if best is None:
        why = "no trial completed within the budget: the run trains the settings as configured"
    return (cfg if best is None else with_values(cfg, best.values)), best, why


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
