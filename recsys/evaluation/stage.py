"""The evaluation stage: every configured ranker ranks valid at each point of its grid, keeps the best, and
ranks test at that point; the run (after training) and ``recsys.evaluate``'s report both call it, so a
ranker's row means one thing everywhere.

    results = evaluate_rankers(rankers, valid=valid_split, test=test_split, ks=[20], metric="recall@20")
    results["test"]["two_tower+graph_filter"]       # metrics
    results["rankers"]["two_tower+graph_filter"]    # fit on, tuned on, chosen point, grid, servable

Each split's rankers are fit on the interactions it follows (valid: train; test: train + valid), parts
before the fusions built on them; a split's fits are released before the next split's are made.
Without valid (a run trained on it) a ranker with a grid needs its point in ``chosen``.
Every fit and every ranking of a split is a task of ``recsys.utils.progress``: a line every 30 s with its ETA (the ranking
primitives count the users ranked; ``estimate``, the plan's cost estimate, gives the ETA before they have).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys.rankers.base import EvalSplit, Fit, Point, Ranker, point_key
from recsys.rankers.stage_cost import StageEstimate
from recsys.ranking.metrics import compute_metrics
from recsys.ranking.scoring import TRAINED_ROW
from recsys.utils.progress import format_seconds, track

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


def _fit_all(
    rankers: Sequence[Ranker], split: EvalSplit, estimate: StageEstimate | None = None, kept: dict | None = None
) -> tuple[dict[str, Fit], dict[str, float]]:
    """Each ranker's fit on ``split`` (parts first, as ``fit_order`` lists them) and its seconds, with progress lines
    (``estimate``: the plan's, for their ETAs); ``kept``: fits reused from and added to it, for the rankers that are
    fit on the interactions alone (no trained weights, no parts), whose fit is the same for every training of one
    dataset (a search's trials)."""
    fits: dict[str, Fit] = {}
    seconds: dict[str, float] = {}
    for ranker in rankers:
        start = time.perf_counter()
        key = (ranker.name, repr(ranker.settings()), split.name, split.fit_on)
        if kept is not None and key in kept:
            fits[ranker.name] = kept[key]
        else:
            with track(
                f"{ranker.name}: fit on {split.fit_on}", estimate=estimate.fit(ranker.name) if estimate else None
            ):
                fits[ranker.name] = ranker.fit(split, fits)
            if kept is not None and not ranker.parts() and ranker.name != TRAINED_ROW:  # not the trained weights
                kept[key] = fits[ranker.name]
        seconds[ranker.name] = time.perf_counter() - start
    return fits, seconds


@dataclass(frozen=True)
class _Ranking:
    """What ranking a split shares across rankers: cut-offs, the tuning metric, the block size, the scorer."""

    ks: list[int]
    metric: str
    chunk_size: int
    score: Score
    estimate: StageEstimate | None = None

    def rank(self, name: str, fit: Fit, split: EvalSplit, grid: Sequence[Point]) -> dict[str, tuple[np.ndarray, dict]]:
        """{point key: (top-k ids int64 [U, max(ks)], metrics)} of ``fit`` (ranker ``name``) at each point of ``grid``."""
        users, points = split.history.num_users, len(grid)
        with track(
            f"{name}: ranking {split.name}" + (f" at {points} points" if points > 1 else ""),
            points * users,
            unit="users x points" if points > 1 else "users",
            estimate=self.estimate.ranking(name, split.name) if self.estimate else None,
        ):
            ids = fit.topk(split, max(self.ks), grid, self.chunk_size)
        num_items = split.history.num_items
        return {
            key: (i.numpy(), self.score(i.numpy(), split.relevant, self.ks, num_items=num_items))
            for key, i in ids.items()
        }


def _record(row: dict, split: EvalSplit, fit: Fit, fits_seconds: float, ranking_seconds: float) -> None:
    """A ranker's results.json row: what it was fit on for ``split``, what that fit saw, and the time: ``seconds`` its
    own fit and its ranking, ``fits_seconds`` its fit and its parts', ``ranking_seconds`` the ranking (what the plan's
    estimate is compared with: scripts/stage_costs.py)."""
    row["fit_on"][split.name] = fit.info().get("fit_on", split.fit_on)
    row["fit"][split.name] = {
        **fit.info(),
        "seconds": round(fits_seconds[0] + ranking_seconds, 1),
        "fits_seconds": round(sum(fits_seconds), 1),
        "ranking_seconds": round(ranking_seconds, 1),
    }


def _fits_seconds(ranker: Ranker, seconds: Mapping[str, float]) -> tuple[float, ...]:
    """(its own fit's seconds, each part's)."""
    return (seconds[ranker.name], *(seconds[p] for p in ranker.parts()))


def _test_point(ranker: Ranker, tuned: Mapping[str, Point]) -> Point:
    """The point test is ranked at: valid's (or given) choice, else the ranker's only point."""
    if ranker.name in tuned:
        return tuned[ranker.name]
    grid = ranker.grid()
    if len(grid) > 1:
        raise ValueError(
            f"ranker {ranker.name!r}: its grid of {len(grid)} points is chosen on valid, and there is no valid "
            "split here; give it one point (its eval settings) or the point the selection stage chose"
        )
    return grid[0]


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
    serve: Sequence[str] = (),
    keep_ids: bool = False,
    score: Score = compute_metrics,
    estimate: StageEstimate | None = None,
) -> dict[str, Any]:
    """``{"valid": {name: metrics}, "test": {name: metrics}, "rankers": {name: what it is}}`` of ``rankers``.

    ``metric`` (e.g. "recall@20") chooses each grid's point on valid (ties: the first point); ``chosen``
    gives points instead (required without valid for a ranker with a grid); ``parts``: rankers that fusions
    are built from without being reported themselves; ``score``: the metrics of a split's top-k ids.
    ``keep``: rankers whose test fit and test top-k ids come back in ``out["kept"][name]`` (what the bundle
    serves); ``serve``: candidates for the served ranker, ``out["served"]`` the servable one best on valid by
    ``metric`` (ties: the later listed; without valid: the last), kept too; ``keep_ids``: every ranker's top-k ids
    per split in ``out["ids"][split][name]`` (int64 numpy); ``estimate``: the plan's cost estimate (the progress lines'
    ETAs before a task has advanced).
    """
    # the tuning metric's cut-off is computed too, whether or not the caller reports it
    cut_offs = sorted({int(k) for k in ks} | {int(metric.partition("@")[2])})
    ranking = _Ranking(cut_offs, metric, chunk_size, score, estimate)
    if estimate is not None:
        _say_estimate(estimate)
    order = fit_order(rankers, {r.name: r for r in [*parts, *rankers]})
    rows = {r.name: {"servable": r.servable, "settings": r.settings(), "fit_on": {}, "fit": {}} for r in rankers}
    out: dict[str, Any] = {"valid": {}, "test": {}, "rankers": rows, "kept": {}}
    ids: dict[str, dict[str, np.ndarray]] = {"valid": {}, "test": {}}
    tuned = dict(chosen)
    for ranker in rankers:
        rows[ranker.name]["tuned_on"] = "given" if ranker.name in chosen else "nothing to tune"
    if valid is not None:
        tuned.update(_tune_on_valid(rankers, order, valid, ranking, chosen, rows, out["valid"], ids["valid"]))
    if serve:
        out["served"] = choose_served(rankers, serve, out["valid"], metric)
        keep = [*keep, out["served"]]
    fits, seconds = _fit_all(order, test, estimate)
    for ranker in rankers:
        start = time.perf_counter()
        point = _test_point(ranker, tuned)
        rows[ranker.name]["point"] = dict(point)
        ids["test"][ranker.name], out["test"][ranker.name] = ranking.rank(
            ranker.name, fits[ranker.name], test, [point]
        )[point_key(point)]
        if ranker.name in keep:
            out["kept"][ranker.name] = (fits[ranker.name], ids["test"][ranker.name])
        ranked = time.perf_counter() - start
        _record(rows[ranker.name], test, fits[ranker.name], _fits_seconds(ranker, seconds), ranked)
    if keep_ids:
        out["ids"] = ids
    return out


def _say_estimate(estimate: StageEstimate) -> None:
    log.info(
        "evaluation stage: about %s estimated (%s)",
        format_seconds(estimate.seconds),
        ", ".join(f"{n} {format_seconds(p.seconds)}" for n, p in estimate.parts.items() if p.known),
    )


def served_on_valid(
    rankers: Sequence[Ranker],
    *,
    valid: EvalSplit,
    candidates: Sequence[str],
    ks: Sequence[int],
    metric: str,
    chunk_size: int = 4096,
    parts: Sequence[Ranker] = (),
    kept_fits: dict | None = None,
    score: Score = compute_metrics,
) -> tuple[str, dict[str, float], np.ndarray]:
    """(the served ranker, its valid metrics, its valid top-k ids): the valid half of ``evaluate_rankers``, each
    ranker at its grid's best point and the served one chosen as the run's stage chooses it, no test ranked (a
    search's trial is ranked by what its run would serve). ``kept_fits``: ``_fit_all``'s."""
    ranking = _Ranking(sorted({int(k) for k in ks} | {int(metric.partition("@")[2])}), metric, chunk_size, score)
    order = fit_order(rankers, {r.name: r for r in [*parts, *rankers]})
    rows = {r.name: {"fit_on": {}, "fit": {}} for r in rankers}
    metrics: dict[str, Any] = {}
    ids: dict[str, np.ndarray] = {}
    _tune_on_valid(rankers, order, valid, ranking, {}, rows, metrics, ids, kept_fits)
    served = choose_served(rankers, candidates, metrics, metric)
    return served, metrics[served], ids[served]


def choose_served(rankers: Sequence[Ranker], candidates: Sequence[str], valid: Mapping[str, dict], metric: str) -> str:
    """The servable ranker of ``candidates`` with the best ``valid`` ``metric`` (ties: the later listed, e.g. a fusion
    whose beta = 0 ties the part it adds to), or without valid figures the last; a ValueError when none is servable."""
    if len(candidates) == 1:  # named (eval.serve): checked against the registry's parts before training
        return candidates[0]
    servable = {r.name for r in rankers if r.servable}
    names = [n for n in candidates if n in servable]
    if not names:
        raise ValueError(f"serve: none of {list(candidates)} is a servable ranker of this stage")
    if not all(n in valid for n in names):
        return names[-1]
    best = names[0]
    for name in names[1:]:
        if valid[name][metric] >= valid[best][metric]:
            best = name
    if len(names) > 1:
        log.info("served: %s, the best on valid %s (%.4f) of %s", best, metric, valid[best][metric], ", ".join(names))
    return best


def _tune_on_valid(
    rankers: Sequence[Ranker],
    order: Sequence[Ranker],
    valid: EvalSplit,
    ranking: _Ranking,
    chosen: Mapping[str, Point],
    rows: dict[str, dict[str, Any]],
    metrics: dict[str, Any],
    ids: dict[str, np.ndarray],
    kept_fits: dict | None = None,
) -> dict[str, Point]:
    """Each ranker's point on valid (``chosen``'s, else its grid's best by ``ranking.metric``): fills its
    valid ``metrics``, top-k ``ids`` and ``rows`` (fit, grid, what tuned it); returns the points."""
    metric = ranking.metric
    tuned = {}
    fits, seconds = _fit_all(order, valid, ranking.estimate, kept_fits)
    for ranker in rankers:
        start = time.perf_counter()
        grid = [chosen[ranker.name]] if ranker.name in chosen else ranker.grid()
        by_point = ranking.rank(ranker.name, fits[ranker.name], valid, grid)
        best = max(grid, key=lambda p: by_point[point_key(p)][1][metric])  # max keeps the first of equal values
        tuned[ranker.name] = best
        ids[ranker.name], metrics[ranker.name] = by_point[point_key(best)]
        ranked = time.perf_counter() - start
        _record(rows[ranker.name], valid, fits[ranker.name], _fits_seconds(ranker, seconds), ranked)
        if len(grid) > 1:
            value = by_point[point_key(best)][1]
            rows[ranker.name]["grid"] = {key: m[metric] for key, (_, m) in by_point.items()}
            rows[ranker.name]["tuned_on"] = f"valid {metric}, {int(value.get('num_users_evaluated', 0))} users"
            log.info("%s: %s chosen on valid %s (%.4f)", ranker.name, point_key(best), metric, value[metric])
    return tuned
