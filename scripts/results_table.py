"""The README's results table, regenerated from one run's offline report.

    $ python -m recsys.train && python -m recsys.evaluate run_dir=runs/default
    $ python scripts/results_table.py runs/default/eval/report.json    # paste over the table in README.md

Every figure of the table comes from that one report.json (test split): no number is typed by hand.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from recsys.utils.markdown import markdown_table

SPLIT = "test"
# (the report's ranker, the row's label: its chosen point's values by name)
ROWS = (
    ("two_tower", "two-tower"),
    ("two_tower+ease", "two-tower + EASE (λ = {lambda:g}, β = {beta:g}, tuned on valid)"),
    ("two_tower+graph_filter", "two-tower + graph filter (β = {beta:g}, tuned on valid)"),
    ("ease", "EASE (λ = {lambda:g}, tuned on valid)"),
    ("ials", "iALS (λ = {regularization:g}, α = {alpha:g}, tuned on valid)"),
    ("popularity", "popularity"),
)
METRICS = (
    ("Recall@10", "recall@10"),
    ("Recall@20", "recall@20"),
    ("Recall@50", "recall@50"),
    ("Recall@100", "recall@100"),
    ("NDCG@10", "ndcg@10"),
    ("NDCG@20", "ndcg@20"),
)
TAIL = ("tail-item Recall@20", "recall@20")  # from the item-popularity breakdown's tail bucket
COLUMNS = [f"{SPLIT} split", *(name for name, _ in METRICS), TAIL[0]]
HEADER = markdown_table(COLUMNS, [])[0]


def _tail(report: dict[str, Any], model: str) -> float:
    buckets = report["splits"][SPLIT]["breakdowns"][model]["item_popularity"]["buckets"]
    return next(b for b in buckets if b["bucket"] == "tail")[TAIL[1]]


def _point(report: dict[str, Any], model: str) -> dict[str, float]:
    """The values valid chose for ``model`` (missing ones: nan)."""
    rows = (report.get("stage") or report.get("graph_filter") or {}).get(
        "rankers", {}
    )  # graph_filter: before 2026-12-07
    row = rows.get(model) or report.get(model) or {}
    point = row.get("point") or {k: v for k, v in row.items() if k in ("lambda", "regularization", "alpha")}
    return defaultdict(lambda: float("nan"), point)


def results_table(report: dict[str, Any], served: str | None = None) -> str:
    """The README's table of ``report``'s test split; ``served``: the ranker the run's bundle serves (marked)."""
    metrics = report["splits"][SPLIT]["metrics"]
    rows = []
    for model, label in ROWS:
        if model not in metrics:  # not ranked (too many items, not in the run's list)
            continue
        cells = [f"{metrics[model][key]:.4f}" for _, key in METRICS] + [f"{_tail(report, model):.4f}"]
        name = label.format_map(_point(report, model))
        rows.append([f"**{name}: served**" if model == served else name, *cells])
    return "\n".join(markdown_table(COLUMNS, rows))


def main(argv: list) -> None:
    if len(argv) != 1:
        sys.exit("usage: python scripts/results_table.py runs/<name>/eval/report.json")
    path = Path(argv[0])
    if not path.is_file():
        sys.exit(f"{path}: no such file; `python -m recsys.evaluate run_dir=runs/<name>` writes it")
    results = path.parent.parent / "results.json"  # the run's: which ranker its bundle serves
    served = json.loads(results.read_text()).get("headline", {}).get("ranker") if results.is_file() else None
    print(results_table(json.loads(path.read_text()), served))


if __name__ == "__main__":
    main(sys.argv[1:])
