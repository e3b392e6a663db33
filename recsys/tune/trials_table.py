"""``<run dir>/tune/trials.json`` and ``trials.md``: every trial of a search, its settings, valid figure, seconds and
state, and the one chosen (written whole, replacing an earlier table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recsys.utils.atomic import write_json_atomic, write_text_atomic
from recsys.utils.markdown import markdown_table

TUNE_DIR = "tune"
COMPLETE = "complete"  # a trial's state once its settings trained out (its epochs, or early stopping)


@dataclass
class Trial:
    number: int
    values: dict[str, Any]  # the knobs' values (config key -> value)
    valid: float | None  # the best epoch's valid figure (eval.valid_metric); None when the trial failed
    seconds: float
    state: str  # "complete", "stopped at the budget", "pruned at epoch <n>" or "failed: <why>"
    best_epoch: int = -1
    valid_users: int = 0  # the users its valid figure averages over, at most (0: not known)
    rank: int | None = None  # tune.parallel_trials: the rank that trained it alone; None: trained on all the ranks
    served: str = "two_tower"  # the ranker its valid figure is of: what its run would serve (the best on valid)
    # (the valid users ascending, the best epoch's figure of each): trials compared user by user; not in trials.json
    per_user: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)


def best_trial(trials: Sequence[Trial]) -> Trial | None:
    """The trial with the highest valid figure (ties: the earlier one), None when none completed; a trial pruned or
    stopped at the budget (before its settings were trained out) is not chosen."""
    scored = [t for t in trials if t.valid is not None and math.isfinite(t.valid) and t.state == COMPLETE]
    return max(scored, key=lambda t: (t.valid, -t.number)) if scored else None


def valid_standard_error(trial: Trial) -> float | None:
    """An upper bound of the standard error of ``trial``'s valid figure, a mean over users of a per-user figure in
    [0, 1] with mean m: sqrt(m (1 - m) / users) (no [0, 1] variable of mean m varies more); None when not known."""
    if trial.valid is None or not trial.valid_users or not 0.0 <= trial.valid <= 1.0:
        return None
    return math.sqrt(trial.valid * (1.0 - trial.valid) / trial.valid_users)


def lead_standard_error(first: Trial, best: Trial) -> tuple[float | None, str]:
    """The standard error of ``best``'s lead over ``first`` on valid, and how it was had: paired where both trials kept
    their users' figures (the standard deviation of the same users' differences / sqrt(users): the users' own spread
    cancels), else ``valid_standard_error`` of ``first`` (a stand-in); None when neither is known."""
    if first.per_user is not None and best.per_user is not None and np.array_equal(first.per_user[0], best.per_user[0]):
        diff = np.asarray(best.per_user[1], dtype=np.float64) - np.asarray(first.per_user[1], dtype=np.float64)
        if len(diff) > 1:
            return float(diff.std(ddof=1) / math.sqrt(len(diff))), f"paired over {len(diff)} users"
    se = valid_standard_error(first)
    return se, f"bounded, {first.valid_users} users"


def selection_factor(candidates: int) -> float:
    """sqrt(2 ln N), at least 1: the expected largest of N standard normal noises is below it, so the best of N
    trials no better than trial 0 leads it by about this many standard errors by chance alone."""
    return max(1.0, math.sqrt(2.0 * math.log(max(candidates, 1))))


def chosen_trial(trials: Sequence[Trial], min_gain_se: float) -> tuple[Trial | None, str]:
    """(the trial the run trains, why): the best on valid, unless trial 0 (the configured settings) completed and the
    best's lead over it is within ``min_gain_se`` x ``selection_factor(N)`` standard errors of that lead, N the
    other trials it was chosen from (the one-standard-error rule, corrected for picking the highest of N: a lead
    that small is what the noise of valid's users gives the best of N trials as good as trial 0)."""
    best = best_trial(trials)
    first = trials[0] if trials and trials[0].number == 0 else None
    if best is None or first is None or best is first or best_trial([first]) is None:
        return best, "" if best is None else f"trial {best.number}: the best on valid"
    se, how = lead_standard_error(first, best)
    others = sum(1 for t in trials if t is not first and best_trial([t]) is t)
    factor, lead = selection_factor(others), best.valid - first.valid
    noise = "" if se is None else f" (standard error {se:.4f}, {how})"
    if se is None or min_gain_se <= 0 or lead > min_gain_se * factor * se:
        return best, f"trial {best.number}: the best on valid, {lead:.4f} ahead of the configured settings{noise}"
    return first, (
        f"trial 0, the configured settings: the best of {others} others, trial {best.number}, is {lead:.4f} ahead "
        f"on valid, within tune.min_gain_se={min_gain_se:g} x {factor:.2f} (sqrt(2 ln {others})) standard errors "
        f"of that lead ({se:.4f}, {how})"
    )


def write_trials(run_dir: Path, trials: Sequence[Trial], summary: dict[str, Any]) -> Path:
    """Both files into ``run_dir/tune/``; returns the folder."""
    out = run_dir / TUNE_DIR
    out.mkdir(parents=True, exist_ok=True)
    shown = [{k: v for k, v in asdict(t).items() if k != "per_user"} for t in trials]
    write_json_atomic(out / "trials.json", {**summary, "trials": shown})
    keys = list(dict.fromkeys(k for t in trials for k in t.values))
    ranks = any(t.rank is not None for t in trials)  # tune.parallel_trials: which rank trained each
    rows = [
        [t.number, *([_shown(t.rank)] if ranks else []), *[_shown(t.values.get(k)) for k in keys], _shown(t.valid),
         t.served, f"{t.seconds:.0f}", t.state]
        for t in trials
    ]  # fmt: skip
    lines = [
        f"# Search on valid: {summary['metric']}, {len(trials)} trials in {summary['seconds']:.0f} s "
        f"(budget {summary['budget_minutes']:g} min)",
        "",
        f"Chosen: {summary.get('why') or 'trial ' + str(summary['chosen'])} (trained as the run: results.json)."
        if summary["chosen"] is not None
        else "No trial completed: the run trains the settings as given.",
        "",
        *markdown_table(
            ["trial", *(["rank"] if ranks else []), *keys, f"valid {summary['metric']}", "of", "seconds", "state"],
            rows,
        ),
        "",
    ]
    write_text_atomic(out / "trials.md", "\n".join(lines))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
