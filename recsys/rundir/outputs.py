"""A training run's outputs: metrics.jsonl + TensorBoard curves, results.json, the results table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recsys.utils.atomic import write_json_atomic, write_text_atomic
from recsys.utils.markdown import markdown_table

__all__ = ["MetricsLog", "drop_records_after", "format_results_table", "write_json_atomic"]


def _step(line: str) -> float:
    try:
        return json.loads(line).get("step", 0)
    except (ValueError, AttributeError):  # a line torn by the crash
        return float("inf")


def drop_records_after(path: Path, step: int) -> None:
    """Resuming from step ``step``: drop the records a crashed attempt logged after it (they are logged
    again), so every step appears once. Rewritten atomically; a missing file is fine."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _step(line) <= step]
    if len(kept) == len(lines):
        return
    write_text_atomic(path, "".join(kept))


def _purge_step(run_dir: Path) -> int | None:
    """The first step TensorBoard must forget from earlier event files: the one after the last record
    metrics.jsonl kept (``drop_records_after``: a resumed run logs the rest again); None: no earlier events."""
    path = run_dir / "metrics.jsonl"
    if not (run_dir / "tb").is_dir() or not path.is_file():
        return None
    steps = [s for s in (_step(line) for line in path.read_text().splitlines() if line.strip()) if s != float("inf")]
    return int(max(steps)) + 1 if steps else None


class MetricsLog:
    """Appends one JSON object per record to metrics.jsonl and mirrors scalars to TensorBoard (the trainer refuses a
    metrics.jsonl that is a symbolic link first: recsys/rundir/links.py)."""

    def __init__(self, run_dir: Path, *, enabled: bool) -> None:
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow, and rank 0 only

        self._file = open(run_dir / "metrics.jsonl", "a")
        # resumed after a crash: TensorBoard hides the crashed attempt's events past the records kept
        self._tb = SummaryWriter(log_dir=str(run_dir / "tb"), purge_step=_purge_step(run_dir))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = int(record["step"])
        for key, value in record.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)):
                self._tb.add_scalar(key if "/" in key else f"train/{key}", value, step)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()


def format_results_table(results: dict[str, Any], ks: Sequence[int]) -> str:
    """Markdown table: one row per (split, ranker), recall and NDCG at each k, whether the bundle can serve it
    (``served``: the headline ranker recsys.export ships; runs from before the rankers: no such column)."""
    columns = [f"recall@{k}" for k in ks] + [f"ndcg@{k}" for k in ks]
    rankers, headline = results.get("rankers"), results.get("headline", {}).get("ranker")

    def serving(model: str) -> list[str]:
        if rankers is None:
            return []
        if model == headline:  # the headline, not shippable where the bundle cannot serve the query encoder yet
            return ["served" if results["headline"].get("servable", True) else "headline, not exportable"]
        return ["servable" if rankers.get(model, {}).get("servable") else "no"]

    rows = [
        [split, model, *serving(model), *(f"{metrics[c]:.4f}" for c in columns)]
        for split in ("valid", "test")
        for model, metrics in results[split].items()
    ]
    lines = markdown_table(["split", "model", *(["bundle"] if rankers is not None else []), *columns], rows)
    train = results["train"]
    lines.append(
        f"\ntrain: {train['steps']} steps in {train['seconds']:.1f} s ({train['samples_per_s']:.0f} samples/s), best epoch {train['best_epoch']}"
    )
    return "\n".join(lines)
