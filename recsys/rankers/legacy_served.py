"""``<run dir>/served/`` as runs wrote it before served rankers were made of parts (served.json without "parts"):
vectors.pt held the two rankers it could serve side by side, the two-tower's columns first. Read into parts, so that
``recsys.export`` of such a run builds today's bundle, ranking as the run did."""

from __future__ import annotations

from pathlib import Path

from recsys.rankers.graph_filter.part import GraphFilterPart
from recsys.rankers.served import Served
from recsys.rankers.two_tower.part import TwoTowerPart
from recsys.utils.safe_load import torch_load_weights


def read_legacy_served(root: Path, meta: dict) -> Served:
    """The served ranker of an earlier run's ``root`` (served/) with its served.json ``meta``."""
    tensors = torch_load_weights(root / "vectors.pt")
    items, width = tensors["item_vectors"], int(meta["two_tower_dim"])
    parts, covariances = [], []
    if width:
        parts.append(TwoTowerPart(items[:, :width], tensors.get("unranked")))
        covariances.append(tensors.get("covariance.two_tower"))
    if meta.get("graph_dim"):
        parts.append(GraphFilterPart(items[:, width:], query_table=tensors["graph_query"]))
        covariances.append(tensors.get("covariance.graph_filter"))
    weights = [1.0, float(meta["beta"])] if len(parts) == 2 else [1.0]
    return Served(parts, weights, covariances if len(parts) == 2 else None)
