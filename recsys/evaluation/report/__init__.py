"""The offline evaluation report: the two-tower beside popularity and the evaluation stage's rankers, breakdowns,
ANN, files. It names no ranker: it reports the rows the stage ranked, each labelled by its package (the registry's
``ranker_label``).

``recsys.job.offline`` embeds users and items (on any number of ranks), assembles an
``EvalInputs`` on rank 0 and calls ``evaluate_and_report``; everything below is plain arrays, no
process group. One stage per module: ``types`` (inputs, options, result), ``compute`` (ranking,
metrics, breakdowns, ANN; ``stage_rankers``: the stage's rankers, planned and ranked), ``markdown`` (report.md),
``plot`` (recall_at_k.png); this module writes the files.

Written into ``<run_dir>/eval/``, each file via a temporary file renamed into place:

    report.json              every number: metrics per split x model at every K, recall-vs-K curves,
                             breakdowns, "stage": each stage ranker's row (its chosen point, valid grid,
                             fits) or why it was skipped, ANN recall + latency, protocol, counts
    report.md                the same as readable tables, the protocol, the gap sentences
    recall_at_k.png          Recall@K for K = 1..max(ks), one panel per split, one line per model
    recommendations.parquet  the two-tower's top-K per user of one split (raw ids / titles when
                             the dataset dir has vocab/users.parquet, vocab/items.parquet, titles)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from recsys.evaluation.report.compute import compute_report, describe_protocol, recall_curve
from recsys.evaluation.report.markdown import format_markdown
from recsys.evaluation.report.plot import plot_recall_at_k
from recsys.evaluation.report.types import EVAL_DIR, EvalInputs, EvalReport, ReportOptions, SplitInputs
from recsys.utils.atomic import write_atomic, write_text_atomic

__all__ = [
    "EVAL_DIR",
    "EvalInputs",
    "EvalReport",
    "ReportOptions",
    "SplitInputs",
    "compute_report",
    "describe_protocol",
    "evaluate_and_report",
    "format_markdown",
    "plot_recall_at_k",
    "recall_curve",
    "write_report",
]


def _jsonable(obj: Any) -> Any:
    """NaN / inf -> None (strict JSON), numpy scalars and arrays -> Python."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_report(result: EvalReport, run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Writes report.json, report.md, recall_at_k.png, recommendations.parquet into ``out_dir`` (None: ``<run_dir>/eval/``)."""
    out_dir = Path(out_dir) if out_dir else Path(run_dir) / EVAL_DIR
    report = _jsonable(result.report)

    write_text_atomic(out_dir / "report.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
    write_text_atomic(out_dir / "report.md", format_markdown(report))
    plot_recall_at_k(result.curves, report["ks"], out_dir / "recall_at_k.png", report["model"])
    write_atomic(out_dir / "recommendations.parquet", lambda tmp: result.recommendations.to_parquet(tmp, index=False))
    return out_dir


def evaluate_and_report(
    inputs: EvalInputs, run_dir: str | Path, options: ReportOptions = ReportOptions(), out_dir: str | Path | None = None
) -> dict:
    """``compute_report`` then ``write_report``; returns the report dict (as written to report.json)."""
    result = compute_report(inputs, options)
    write_report(result, run_dir, out_dir)
    return _jsonable(result.report)
