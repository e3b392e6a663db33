"""The evaluation stage: every configured ranker ranks valid at each point of its grid, keeps the best, and
ranks test at that point; the run (after training) and ``recsys.evaluate``'s report both call it, so a
ranker's row means one thing everywhere.

    results = evaluate_rankers(rankers, valid=valid_split, test=test_split, ks=[20], metric="recall@20")
    results["test"]["two_tower+graph_filter"]       # metrics
    results["rankers"]["two_tower+graph_filter"]    # fit on, tuned on, chosen point, grid, servable

Each split's rankers are fit on the interactions it follows (valid: train; test: train + valid), parts
before the fusions built on them; a split's fits are released before the next split's are made.
Without valid (a run trained on it) a ranker with a grid needs its point in ``chosen``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recsys.evaluation.metrics import compute_metrics
from recsys.rankers.base import EvalSplit, Fit, Point, Ranker, point_key

log = logging.getLogger(__name__)

Score = Callable[..., dict[str, float]]  # (top-k ids [U, k] numpy, relevant CSR, ks, num_items=...) -> metrics


def fit_order(rankers: Sequence[Ranker], known: Mapping[str, Ranker]) -> list[Ranker]:
    """``rankers`` with every part a fusion needs before it (parts not listed are fit, not reported)."""
    order: dict[str, Ranker] = {}

    def add(ranker: Ranker) -> None:
        for part in ranker.parts():
            if part not in known:
                raise ValueError(f"ranker {ranker.name!r} is built from {part!r}, which is not configured")
            add(known[part])
        order.setdefault(ranker.name, ranker)

    for ranker in rankers:
        add(ranker)
    return list(order.values())


def _fit_all(rankers: Sequence[Ranker], split: EvalSplit) -> tuple[dict[str, Fit], dict[str, float]]:
    fits: dict[str, Fit] = {}
    seconds: dict[str, float] = {}
    for ranker in rankers:
        start = time.perf_counter()
        fits[ranker.name] = ranker.fit(split, fits)
        seconds[ranker.name] = time.perf_counter() - start
    return fits, seconds


def evaluate_rankers(
    rankers: Sequence[Ranker],
    *,
    valid: EvalSplit | None,
    test: EvalSplit,
    ks: Sequence[int],
    metric: str,
    chunk_size: int = 4096,
    chosen: Mapping[str, Point] = {},
    parts: Sequence[Ranker] = (),
    keep: Sequence[str] = (),
    keep_ids: bool = False,
    score: Score = compute_metrics,
) -> dict[str, Any]:
    """``{"valid": {name: metrics}, "test": {name: metrics}, "rankers": {name: what it is}}`` of ``rankers``.

    ``metric`` (e.g. "recall@20") chooses each grid's point on valid (ties: the first point); ``chosen``
    gives points instead (required without valid for a ranker with a grid); ``parts``: rankers that fusions
    are built from without being reported themselves; ``score``: the metrics of a split's top-k ids.
    ``keep``: rankers whose test fit and test top-k ids come back in ``out["kept"][name]`` (what the bundle
    serves); ``keep_ids``: every ranker's top-k ids per split in ``out["ids"][split][name]`` (int64 numpy).
    """
    # the tuning metric's cut-off is computed too, whether or not the caller reports it
    ks = sorted({int(k) for k in ks} | {int(metric.partition("@")[2])})
    kmax = max(ks)
    known = {r.name: r for r in [*parts, *rankers]}
    order = fit_order(rankers, known)
    out: dict[str, Any] = {"valid": {}, "test": {}, "rankers": {}, "kept": {}}
    all_ids: dict[str, dict[str, Any]] = {"valid": {}, "test": {}}
    points = dict(chosen)
    for ranker in rankers:
        out["rankers"][ranker.name] = {
            "servable": ranker.servable,
            "settings": ranker.settings(),
            "fit_on": {},
            "fit": {},
        }
    if valid is not None:
        fits, seconds = _fit_all(order, valid)
        for ranker in rankers:
            grid = [p for p in ranker.grid()] if ranker.name not in chosen else [chosen[ranker.name]]
            start = time.perf_counter()
            ids = fits[ranker.name].topk(valid, kmax, grid, chunk_size)
            by_point = {
                key: score(ids[key].numpy(), valid.relevant, ks, num_items=valid.history.num_items) for key in ids
            }
            best = max(grid, key=lambda p: by_point[point_key(p)][metric])  # max keeps the first of equal values
            points[ranker.name] = best
            all_ids["valid"][ranker.name] = ids[point_key(best)].numpy()
            out["valid"][ranker.name] = by_point[point_key(best)]
            row = out["rankers"][ranker.name]
            row["fit_on"]["valid"] = fits[ranker.name].info().get("fit_on", valid.fit_on)
            row["fit"]["valid"] = {
                **fits[ranker.name].info(),
                "seconds": round(seconds[ranker.name] + time.perf_counter() - start, 1),
            }
            if len(grid) > 1:
                row["grid"] = {key: m[metric] for key, m in by_point.items()}
                row["tuned_on"] = (
                    f"valid {metric}, {int(by_point[point_key(best)].get('num_users_evaluated', 0))} users"
                )
                log.info(
                    "%s: %s chosen on valid %s (%.4f)",
                    ranker.name,
                    point_key(best),
                    metric,
                    by_point[point_key(best)][metric],
                )
        del fits
    fits, seconds = _fit_all(order, test)
    for ranker in rankers:
        row = out["rankers"][ranker.name]
        if ranker.name in chosen:
            row.setdefault("tuned_on", "given")
        point = points.get(ranker.name)
        if point is None:
            grid = ranker.grid()
            if len(grid) > 1:
                raise ValueError(
                    f"ranker {ranker.name!r}: its grid of {len(grid)} points is chosen on valid, and there is no valid "
                    "split here; give it one point (its eval settings) or the point the selection stage chose"
                )
            point = grid[0]
        row.setdefault("tuned_on", "nothing to tune")
        row["point"] = dict(point)
        start = time.perf_counter()
        ids = fits[ranker.name].topk(test, kmax, [point], chunk_size)[point_key(point)].numpy()
        all_ids["test"][ranker.name] = ids
        out["test"][ranker.name] = score(ids, test.relevant, ks, num_items=test.history.num_items)
        if ranker.name in keep:
            out["kept"][ranker.name] = (fits[ranker.name], ids)
        row["fit_on"]["test"] = fits[ranker.name].info().get("fit_on", test.fit_on)
        row["fit"]["test"] = {
            **fits[ranker.name].info(),
            "seconds": round(seconds[ranker.name] + time.perf_counter() - start, 1),
        }
    if keep_ids:
        out["ids"] = all_ids
    return out
