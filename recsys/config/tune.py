"""The ``tune`` section of the training config (conf/tune/default.yaml): the budgeted search on valid that
``python -m recsys.train ... tune.budget_minutes=N`` runs before it trains the chosen settings (recsys/tune/);
``check_tune`` refuses values no search can use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from recsys.config.need import Need

KNOB_KINDS = ("log", "float", "int", "choice")  # tune.space[*].kind


@dataclass
class KnobConfig:
    """One setting the search varies: a key of the training config and the values it may take."""

    key: str = MISSING  # the training config's key, e.g. model.loss.temperature or model.tables.item.embedding_dim
    kind: str = "log"  # log: a float drawn on a log scale | float | int: in [low, high] | choice: one of choices
    low: float = 0.0  # log / float / int: the lowest value (log: > 0)
    high: float = 0.0  # log / float / int: the highest value
    choices: list[Any] = field(default_factory=list)  # choice: the values


def _knob(key: str, kind: str, low: float = 0.0, high: float = 0.0, choices: list | None = None) -> KnobConfig:
    return KnobConfig(key, kind, low, high, list(choices or []))


def default_space() -> list[KnobConfig]:
    """The knobs that matter to the two-tower, over ranges wide enough for catalogues of 10^3 to 10^6 items (why
    these: docs/quality.md, "The budgeted search"); the rankers' own grids are the evaluation stage's."""
    return [
        _knob("model.loss.temperature", "log", 0.03, 0.3),
        _knob("optim.sparse.lr", "log", 0.01, 0.3),
        _knob("optim.dense.lr", "log", 1e-4, 3e-3),
        _knob("model.tables.item.embedding_dim", "choice", choices=[64, 128, 256]),
        _knob("data.history_length", "choice", choices=[20, 50, 100, 200]),
        _knob("data.history_dropout", "float", 0.0, 0.5),
    ]


@dataclass
class TuneConfig:
    # null: no search (train the config as it is); N > 0: search on valid for N minutes, then train the best settings
    budget_minutes: float | None = None
    max_trials: int = 0  # at most this many trials; 0 = as many as the budget allows
    seed: int = 0  # seeds the sampler: the same seed proposes the same settings
    trial_epochs: int = (
        0  # each trial's epoch cap; 0 = trainer.epochs (early stopping on valid ends most trials sooner)
    )
    # true: a trial whose valid figure after an epoch (from its 2nd on) is below the median of the earlier trials' at
    # that epoch stops there (Optuna's MedianPruner), once prune_after_trials trials have ended; it is not chosen
    prune: bool = True
    prune_after_trials: int = 2  # tune.prune acts once this many trials have ended
    # the best trial replaces the configured settings (trial 0) only if ahead of them on valid by more than this many
    # standard errors of its lead (paired: the same users' figures), times sqrt(2 ln N) for the best of N trials: the
    # one-standard-error rule, corrected for picking the highest of N (recsys/tune/trials_table.py); 0 = the best
    min_gain_se: float = 1.0
    # under torchrun: false = every trial trains on all the ranks, its tables sharded as the run's; true = each rank
    # trains a trial of its own at once, alone on its own device (a process of one rank): world-size trials at a
    # time, for tables that fit one device (recsys/tune/per_rank.py)
    parallel_trials: bool = False
    space: list[KnobConfig] = field(default_factory=default_space)  # the settings varied and their ranges


def check_tune(t: TuneConfig, need: Need, has_key) -> None:
    """tune.*: a positive budget, knobs whose keys exist (``has_key(path)``) and whose ranges make sense."""
    if t.budget_minutes is not None:
        need(t.budget_minutes > 0, "tune.budget_minutes", t.budget_minutes, "must be > 0 minutes (null: no search)")
    need(
        t.max_trials >= 0 and t.trial_epochs >= 0 and t.prune_after_trials >= 0,
        "tune.max_trials / trial_epochs / prune_after_trials",
        (t.max_trials, t.trial_epochs, t.prune_after_trials),
        "must be >= 0",
    )
    need(t.min_gain_se >= 0, "tune.min_gain_se", t.min_gain_se, "must be >= 0 standard errors (0: the best on valid)")
    for i, k in enumerate(t.space):
        where = f"tune.space[{i}]"
        # checked only for a search: the default space's model.loss.temperature is no key of a loss without one
        need(
            t.budget_minutes is None or has_key(k.key),
            f"{where}.key",
            k.key,
            "must name a key of the training config (with its model.loss: drop the knob from tune.space)",
        )
        need(k.kind in KNOB_KINDS, f"{where}.kind", k.kind, f"choose one of {', '.join(KNOB_KINDS)}")
        if k.kind == "choice":
            need(len(k.choices) > 0, f"{where}.choices", list(k.choices), "must list the values to choose from")
        elif k.kind in KNOB_KINDS:
            need(k.low < k.high and (k.kind != "log" or k.low > 0), f"{where}.low / high", (k.low, k.high),
                 "must be low < high (log: low > 0)")  # fmt: skip
