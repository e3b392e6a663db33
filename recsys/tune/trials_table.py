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


def best_trial(trials: Sequence[Trial]) -> Trial | None:
    """The trial with the highest valid figure (ties: the earlier one), None when none completed; a pruned trial
    (stopped before its settings were trained out) is not chosen."""
    scored = [t for t in trials if t.valid is not None and math.isfinite(t.valid) and not t.state.startswith("pruned")]
    return max(scored, key=lambda t: (t.valid, -t.number)) if scored else None


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
        f"Chosen: trial {summary['chosen']} (trained as the run: results.json)."
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
