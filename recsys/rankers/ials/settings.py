"""iALS's settings (``eval.settings.ials``: conf/eval/rankers/ials.yaml) and their rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.need import Need
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
