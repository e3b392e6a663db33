"""A ranker's tuned settings: a point of its grid, and the key results.json names it by."""

from __future__ import annotations

from collections.abc import Mapping

Point = Mapping[str, float]  # one setting of a ranker's tuned parameters; {} when it has none


def point_key(point: Point) -> str:
    """``alpha=0.1,sharpen=2.5`` (``-`` for no parameters): how results.json names a grid point."""
    return ",".join(f"{name}={value:g}" for name, value in point.items()) or "-"
