"""iALS's settings (``eval.settings.ials``: conf/eval/rankers/ials.yaml), their rules and its cost estimate."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.need import Need
from recsys.rankers.cost import RankerCost
from recsys.rankers.resources import Resources


@dataclass
class IalsSettings:
    """implicit's alternating least squares (recsys/rankers/ials/solve.py), λ and α chosen on valid."""

    regularizations: list[float] = field(default_factory=lambda: [0.1, 1.0, 10.0])  # λ grid, chosen on valid
    alphas: list[float] = field(default_factory=lambda: [3.0, 10.0, 30.0])  # α grid: a seen item's weight against 1
    factors: int = 64  # D: the factors' width
    iterations: int = 15  # ALS sweeps


def check_settings(s: IalsSettings, need: Need, key: str) -> None:
    for name in ("regularizations", "alphas"):
        values = list(getattr(s, name))
        need(len(values) > 0 and all(v > 0 for v in values), f"{key}.{name}", values, "must be values > 0")
    need(s.factors >= 1 and s.iterations >= 1, f"{key}.factors / iterations", (s.factors, s.iterations), "must be >= 1")


def check_resources(s: IalsSettings, r: Resources, key: str) -> str:
    """The refusal of a fit without its library ("" when ``implicit`` imports)."""
    try:
        import implicit.cpu.als  # noqa: F401, PLC0415 (a declared dependency; a broken install is said, not fatal)
    except ImportError as e:
        return f"iALS needs the implicit package ({e}): pip install implicit"
    return ""


def estimate(s: IalsSettings, r: Resources) -> RankerCost:
    """One ALS fit per point of its grid (``iterations`` sweeps of interactions x D + (users + items) x D² work, at
    implicit's measured rate), then a [chunk, D] x [D, I] GEMM a block."""
    t = r.throughput
    d = s.factors
    fit = t.ns(t.ials_ns) * s.iterations * (r.interactions * d + (r.num_users + r.num_items) * d * d)
    points = len(s.regularizations) * len(s.alphas)
    return RankerCost(
        peak_bytes=4 * 3 * (r.num_users + r.num_items) * d + 12 * r.interactions,
        score_s=t.dense(2 * d),
        width=d,
        points=points,
        passes=points,
        pass_seconds=fit,
        what=f"{points} ALS fits of {d} factors",
    )
