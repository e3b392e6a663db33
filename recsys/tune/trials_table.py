"""``<run dir>/tune/trials.json`` and ``trials.md``: every trial of a search, its settings, valid figure, seconds and
state, and the one chosen (written whole, replacing an earlier table)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recsys.atomic import write_json_atomic, write_text_atomic
from recsys.markdown import markdown_table

TUNE_DIR = "tune"


@dataclass
class Trial:
    number: int
    values: dict[str, Any]  # the knobs' values (config key -> value)
    valid: float | None  # the best epoch's valid figure (eval.valid_metric); None when the trial failed
    seconds: float
    state: str  # "complete", "stopped at the budget", "pruned at epoch <n>" or "failed: <why>"
    best_epoch: int = -1
    valid_users: int = 0  # the users its valid figure averages over, at most (0: not known)


def best_trial(trials: Sequence[Trial]) -> Trial | None:
    """The trial with the highest valid figure (ties: the earlier one), None when none completed; a pruned trial
    (stopped before its settings were trained out) is not chosen."""
    scored = [t for t in trials if t.valid is not None and math.isfinite(t.valid) and not t.state.startswith("pruned")]
    return max(scored, key=lambda t: (t.valid, -t.number)) if scored else None


def valid_standard_error(trial: Trial) -> float | None:
    """An upper bound of the standard error of ``trial``'s valid figure, a mean over users of a per-user figure in
    [0, 1] with mean m: sqrt(m (1 - m) / users) (no [0, 1] variable of mean m varies more); None when not known."""
    if trial.valid is None or not trial.valid_users or not 0.0 <= trial.valid <= 1.0:
        return None
    return math.sqrt(trial.valid * (1.0 - trial.valid) / trial.valid_users)


def chosen_trial(trials: Sequence[Trial], min_gain_se: float) -> tuple[Trial | None, str]:
    """(the trial the run trains, why): the best on valid, unless trial 0 (the configured settings) completed and the
    best is ahead of it by no more than ``min_gain_se`` standard errors of trial 0's figure (the one-standard-error
    rule: a lead that small is the noise of valid's users, and picking the highest of many trials inflates it)."""
    best = best_trial(trials)
    first = trials[0] if trials and trials[0].number == 0 else None
    if best is None or first is None or best is first or best_trial([first]) is None:
        return best, "" if best is None else f"trial {best.number}: the best on valid"
    se = valid_standard_error(first)
    lead = best.valid - first.valid
    if se is None or min_gain_se <= 0 or lead > min_gain_se * se:
        return best, f"trial {best.number}: the best on valid, {lead:.4f} ahead of the configured settings"
    return first, (
        f"trial 0, the configured settings: the best, trial {best.number}, is {lead:.4f} ahead on valid, within "
        f"tune.min_gain_se={min_gain_se:g} standard errors ({se:.4f}, {first.valid_users} users)"
    )


def write_trials(run_dir: Path, trials: Sequence[Trial], summary: dict[str, Any]) -> Path:
    """Both files into ``run_dir/tune/``; returns the folder."""
    out = run_dir / TUNE_DIR
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "trials.json", {**summary, "trials": [asdict(t) for t in trials]})
    keys = list(dict.fromkeys(k for t in trials for k in t.values))
    rows = [
        [t.number, *[_shown(t.values.get(k)) for k in keys], _shown(t.valid), f"{t.seconds:.0f}", t.state]
        for t in trials
    ]
    lines = [
        f"# Search on valid: {summary['metric']}, {len(trials)} trials in {summary['seconds']:.0f} s "
        f"(budget {summary['budget_minutes']:g} min)",
        "",
        f"Chosen: {summary.get('why') or 'trial ' + str(summary['chosen'])} (trained as the run: results.json)."
        if summary["chosen"] is not None
        else "No trial completed: the run trains the settings as given.",
        "",
        *markdown_table(["trial", *keys, f"valid {summary['metric']}", "seconds", "state"], rows),
        "",
    ]
    write_text_atomic(out / "trials.md", "\n".join(lines))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
