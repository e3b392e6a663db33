"""The README's results table, regenerated from one run's offline report.

    $ python -m recsys.train && python -m recsys.evaluate run_dir=runs/default
    $ python scripts/results_table.py runs/default/eval/report.json    # paste over the table in README.md

Every figure of the table comes from that one report.json (test split): no number is typed by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from recsys.markdown import markdown_table

SPLIT = "test"
ROWS = (
    ("two_tower", "two-tower"),
    ("ease", "EASE (λ = {lam:g}, tuned on valid)"),
    ("ials", "iALS (λ = {reg:g}, α = {alpha:g}, tuned on valid)"),
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


def results_table(report: dict[str, Any]) -> str:
    metrics = report["splits"][SPLIT]["metrics"]
    rows = []
    for model, label in ROWS:
        if model not in metrics:  # EASE / iALS skipped (too many items, or disabled)
            continue
        lam = (report.get("ease") or {}).get("lambda", float("nan"))
        ials = report.get("ials") or {}
        reg, alpha = ials.get("regularization", float("nan")), ials.get("alpha", float("nan"))
        cells = [f"{metrics[model][key]:.4f}" for _, key in METRICS] + [f"{_tail(report, model):.4f}"]
        rows.append([label.format(lam=lam, reg=reg, alpha=alpha), *cells])
    return "\n".join(markdown_table(COLUMNS, rows))


def main(argv: list) -> None:
    if len(argv) != 1:
        sys.exit("usage: python scripts/results_table.py runs/<name>/eval/report.json")
    path = Path(argv[0])
    if not path.is_file():
        sys.exit(f"{path}: no such file; `python -m recsys.evaluate run_dir=runs/<name>` writes it")
    print(results_table(json.loads(path.read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
