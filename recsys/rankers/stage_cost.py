"""The evaluation stage's cost before any work, and the default list fitted to the host: one line per part with its
estimated time and peak memory (each ranker package's ``estimate``, recsys/rankers/cost.py). A part of a default list
(``eval.rankers: null``, or recsys.evaluate's ``rankers: null``) out of proportion, estimated longer than
``eval.default_max_minutes`` or needing more than ``eval.default_max_memory_share`` of the memory available, runs with
the graph filter at a lower rank (halved down to ``RANK_FLOOR``) or is left out, and the log says which and why; a
part the user listed is kept, with a warning.

    plan = plan_stage(names, eval_cfg.settings, resources, adaptable=names, max_seconds=600, memory_share=0.5)
    plan.names, plan.settings     # what to rank, and the settings to rank it with (eval.settings, rank maybe lowered)
    plan.log(log)                 # an estimate line per part, then what was lowered or left out, and why
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recsys.rankers.cost import GB, RankerCost, fusion_points, fusion_seconds, ranking_seconds
from recsys.rankers.registry import COMBINATORS, FUSION, SETTINGS, TRAINED, ranker_specs, settings_of
from recsys.rankers.resources import Resources
from recsys.utils.progress import format_seconds

GRAPH_FILTER = "graph_filter"
# the lowest rank a default list lowers the graph filter to: its low-pass filter's width (GF-CF's 256); below it the
# filter would rank well under its published figure (docs/quality.md), so a part still too long there is left out
RANK_FLOOR = 256
ALWAYS = (TRAINED, "popularity")  # never left out: what was trained, and the baseline whose cost is one selection
BOUND_KEYS = ("eval.default_max_minutes", "eval.default_max_memory_share")  # the bounds' config keys, for the log


@dataclass(frozen=True)
class PartEstimate:
    """One listed ranker's estimated cost in the stage: its parts' fits on every split, its ranking of valid (its grid)
    and of test (one point), and the memory its fits hold at once."""

    name: str
    fit_seconds: float
    valid_seconds: float
    test_seconds: float
    peak_bytes: int
    what: str = ""
    known: bool = True  # False: a part of it has no estimate (a plug-in's): left as it is

    @property
    def seconds(self) -> float:
        return self.fit_seconds + self.valid_seconds + self.test_seconds

    def line(self) -> str:
        if not self.known:
            return f"{self.name}: no cost estimate (a ranker without one)"
        what = f" ({self.what})" if self.what else ""
        return (
            f"{self.name}{what}: about {format_seconds(self.seconds)} (fits {format_seconds(self.fit_seconds)}, "
            f"valid {format_seconds(self.valid_seconds)}, test {format_seconds(self.test_seconds)}), "
            f"peak {format_bytes(self.peak_bytes)}"
        )


@dataclass(frozen=True)
class StageEstimate:
    """Every listed ranker's ``PartEstimate``, and one fit of each ranker they are built from (the progress lines'
    ETAs: ``fit`` and ``ranking``)."""

    parts: dict[str, PartEstimate]
    fits: dict[str, float]  # one fit's seconds, by ranker (fusions' parts included)
    num_fits: int = 2  # fits per ranker: valid's and test's

    @property
    def seconds(self) -> float:
        """The stage: each ranker fit once per split, each listed one ranking valid and test."""
        rankings = sum(p.valid_seconds + p.test_seconds for p in self.parts.values())
        return self.num_fits * sum(self.fits.values()) + rankings

    def fit(self, name: str) -> float | None:
        return self.fits.get(name)

    def ranking(self, name: str, split: str) -> float | None:
        part = self.parts.get(name)
        if part is None or not part.known:
            return None
        return part.valid_seconds if split == "valid" else part.test_seconds


def format_bytes(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= 0.95 * GB else f"{n / 1e6:.0f} MB"


def _costs(names: Sequence[str], settings: Mapping[str, Any], r: Resources) -> dict[str, RankerCost | None]:
    """Each ranker ``names`` are built from: its package's estimate (None: it has none)."""
    out: dict[str, RankerCost | None] = {}
    for name in names:
        for part in name.split("+"):
            spec = ranker_specs().get(part)
            if part not in out:
                out[part] = (
                    None if spec is None or spec.estimate is None else spec.estimate(settings_of(part, settings), r)
                )
    return out


def estimate_stage(names: Sequence[str], settings: Mapping[str, Any], r: Resources) -> StageEstimate:
    """The ``PartEstimate`` of each of ``names`` over ``r`` (valid ranked when ``r.valid_users``; users split over
    nothing: a rank's own users are what ``r`` counts), with ``settings`` (eval.settings, by ranker)."""
    costs = _costs(names, settings, r)
    num_fits = 2 if r.valid_users else 1
    valid_users, test_users, items, t = r.valid_users, r.test_users or r.num_users, r.num_items, r.throughput
    parts = {}
    for name in names:
        split = name.split("+")
        known = [costs[p] for p in split if costs[p] is not None]
        if len(known) < len(split):
            parts[name] = PartEstimate(name, 0.0, 0.0, 0.0, 0, known=False)
            continue
        fits = num_fits * sum(c.fit_seconds for c in known)
        if len(known) == 1:
            c = known[0]
            valid = ranking_seconds(c, t, users=valid_users, items=items, points=c.points) if valid_users else 0.0
            test = ranking_seconds(c, t, users=test_users, items=items, points=1)
            what = ", ".join(w for w in (c.what, f"{c.points} points on valid" if c.points > 1 else "") if w)
            peak = c.peak_bytes
        else:
            first, second = known
            betas = settings_of(FUSION, settings, COMBINATORS).betas
            valid, test = fusion_seconds(first, second, t, users=valid_users or test_users, items=items, betas=betas)
            valid = valid if valid_users else 0.0
            points = fusion_points(first, second, betas)
            what = ", ".join(w for w in (first.what, second.what, f"{points} points on valid") if w)
            peak = first.peak_bytes + second.peak_bytes + 4 * 4 * r.chunk_size * items  # the blocks of a pass
        parts[name] = PartEstimate(name, fits, valid, test, peak, what)
    fits = {name: c.fit_seconds for name, c in costs.items() if c is not None}
    return StageEstimate(parts, fits, num_fits)


@dataclass
class StagePlan:
    """What the stage ranks (``names``) with which settings (``settings``: eval.settings with ``overrides``), the
    estimate of that, and what was decided (``notes``: lowered or left out, and why; ``warnings``: listed parts over
    the bounds, kept)."""

    names: list[str]
    settings: dict[str, Any]
    estimate: StageEstimate
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # name -> why

    def log(self, logger: logging.Logger, threads: int) -> None:
        logger.info(
            "evaluation stage estimate: about %s in all on %d thread%s at the 2-core box's measured rates "
            "(recsys/rankers/cost.py, docs/performance.md)",
            format_seconds(self.estimate.seconds), threads, "s" if threads != 1 else "",
        )  # fmt: skip
        for part in self.estimate.parts.values():
            logger.info("  %s", part.line())
        for note in self.notes:
            logger.info("%s", note)
        for warning in self.warnings:
            logger.warning("%s", warning)

    def describe(self) -> dict:
        """For results.json: the plan's rankers, the settings it changed, its decisions, and each part's estimate."""
        return {
            "rankers": list(self.names),
            "settings": self.overrides,
            "left_out": dict(self.left_out),
            "notes": list(self.notes),
            "estimate": {
                name: {
                    "seconds": round(p.seconds, 1),
                    "fit_seconds": round(p.fit_seconds, 1),
                    "valid_seconds": round(p.valid_seconds, 1),
                    "test_seconds": round(p.test_seconds, 1),
                    "peak_gb": round(p.peak_bytes / GB, 2),
                }
                for name, p in self.estimate.parts.items()
                if p.known
            },
        }


def _over(part: PartEstimate, r: Resources, max_seconds: float, memory_share: float) -> str:
    """Why ``part`` is out of proportion ("" when it is not, or nothing is known of it)."""
    if not part.known:
        return ""
    why = []
    if max_seconds and part.seconds > max_seconds:
        why.append(f"about {format_seconds(part.seconds)}, over {BOUND_KEYS[0]}={max_seconds / 60:g}")
    if memory_share and r.available_bytes is not None and part.peak_bytes > memory_share * r.available_bytes:
        why.append(
            f"{format_bytes(part.peak_bytes)}, over {BOUND_KEYS[1]}={memory_share:g} of the "
            f"{r.available_bytes / GB:.1f} GB available"
        )
    return " and ".join(why)


def _with_rank(settings: Mapping[str, Any], rank: int) -> dict[str, Any]:
    return {**settings, GRAPH_FILTER: {**dict(settings.get(GRAPH_FILTER) or {}), "rank": rank}}


def plan_stage(
    names: Sequence[str],
    settings: Mapping[str, Any],
    r: Resources,
    *,
    adaptable: Collection[str] = (),
    max_seconds: float = 0.0,
    memory_share: float = 0.0,
) -> StagePlan:
    """``names`` fitted to the bounds (``max_seconds``, ``memory_share``; 0: none): of ``adaptable`` (a default
    list's), the graph filter's parts run at the largest rank of ``rank``, ``rank / 2``, ... >= ``RANK_FLOOR`` at which
    they all fit, those that fit at none are left out, and so is any other part over a bound; ``names`` not in
    ``adaptable`` (or in ``ALWAYS``) are kept, a warning saying what they cost."""
    settings = dict(settings)
    names = list(names)
    estimate = estimate_stage(names, settings, r)
    over = {n: _over(p, r, max_seconds, memory_share) for n, p in estimate.parts.items()}
    optional = [n for n in names if n in adaptable and n not in ALWAYS]
    plan = StagePlan(names, settings, estimate)
    graph = [n for n in optional if GRAPH_FILTER in n.split("+") and over[n]]
    if graph:
        graph = [n for n in optional if GRAPH_FILTER in n.split("+")]  # one rank for all of them
        _lower_rank(plan, graph, over, r, max_seconds, memory_share)
        plan.estimate = estimate_stage(plan.names, plan.settings, r)
    for name in [n for n in optional if n in plan.names]:
        why = _over(plan.estimate.parts[name], r, max_seconds, memory_share)
        if why:
            _leave_out(plan, name, why)
    for name in plan.names:
        why = _over(plan.estimate.parts[name], r, max_seconds, memory_share)
        if why and name not in optional and name not in ALWAYS:
            plan.warnings.append(
                f"{name}: {why}; kept, eval.rankers lists it (a default list would lower or leave it out: "
                "docs/evaluation.md, 'What the stage costs')"
            )
    plan.estimate = estimate_stage(plan.names, plan.settings, r)
    return plan


def _lower_rank(
    plan: StagePlan, graph: list[str], over: dict[str, str], r: Resources, max_seconds: float, memory_share: float
) -> None:
    """The graph filter's rank lowered until ``graph`` (the default list's parts with it) fit; those over the bounds
    at ``RANK_FLOOR`` left out, and the rank then the largest at which the rest fit."""
    rank = int(settings_of(GRAPH_FILTER, plan.settings).rank)
    ranks = [rank]
    while ranks[-1] // 2 >= RANK_FLOOR:
        ranks.append(ranks[-1] // 2)

    def fits(names: list[str], at: int) -> dict[str, str]:
        estimate = estimate_stage(names, _with_rank(plan.settings, at), r)
        return {n: _over(estimate.parts[n], r, max_seconds, memory_share) for n in names}

    floor = fits(graph, ranks[-1])
    for name in [n for n in graph if floor[n]]:
        _leave_out(plan, name, f"at rank {rank} {over[name]}; at rank {ranks[-1]} {floor[name]}")
    keep = [n for n in graph if not floor[n]]
    chosen = next((at for at in ranks if keep and not any(fits(keep, at).values())), None)
    if chosen is None or chosen == rank:
        return
    plan.settings = _with_rank(plan.settings, chosen)
    plan.overrides[GRAPH_FILTER] = {"rank": chosen}
    at_rank = estimate_stage(keep, plan.settings, r)
    plan.notes.append(
        f"{', '.join(keep)}: {SETTINGS}.{GRAPH_FILTER}.rank={chosen} instead of {rank} "
        f"({'; '.join(f'{n}: {over[n]}' for n in keep if over[n])} at rank {rank}; "
        f"{', '.join(f'{n} about {format_seconds(at_rank.parts[n].seconds)}' for n in keep)} at {chosen}): "
        f"the default list fitted to this host; name the rankers in eval.rankers to run them at "
        f"{SETTINGS}.{GRAPH_FILTER}.rank as set, or raise {BOUND_KEYS[0]}"
    )


def _leave_out(plan: StagePlan, name: str, why: str) -> None:
    plan.names.remove(name)
    plan.left_out[name] = why
    plan.notes.append(
        f"{name} left out of the default list: {why} (name it in eval.rankers to run it anyway; "
        "docs/evaluation.md, 'What the stage costs')"
    )
