"""What the bundle serves, as the run measured it: the served ranker's test-stage vectors and the run's ranking.

The evaluation stage fits each ranker on the interactions test follows (train + valid) and ranks test with
it; for the served ranker (eval.serve) the run keeps exactly that in ``<run dir>/served/``::

    served.json        ranker, its chosen point, the parts' widths, the test users' count and k
    vectors.pt         item_vectors float32 [I, D] (the parts side by side), graph_query float32 [I, G] (when the
                       graph filter is a part: row j is what item j adds to a query), covariances float64 of each
                       part's item vectors (a fusion's spread normalisation), unranked bool [I] (items the ranker
                       leaves out: never-trained ids of managed tables, recsys/evaluation/untrained.py; when any)
    test_topk.npy      int64 [U, k]: the run's test ranking of the served ranker (test_users.npy: its users)

``recsys.export`` builds the bundle from these, so the bundle ranks as the run did (tests/test_export.py).
Written to a temporary folder and renamed into place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys.atomic import replace_dir
from recsys.rankers.base import DotProductFit, EvalSplit, Point, point_key
from recsys.rankers.fusion import FusionFit, item_covariance
from recsys.rankers.graph_filter import GraphFilterFit
from recsys.rankers.two_tower import TwoTowerFit
from recsys.safe_load import numpy_load, torch_load_weights

SERVED_DIR = "served"


@dataclass
class ServedState:
    """The served ranker in dot-product form: a query is [two-tower part / spread, beta * graph part / spread]."""

    ranker: str
    point: dict
    item_vectors: torch.Tensor  # float32 [I, D_tt + G] (a part absent: width 0)
    two_tower_dim: int  # D_tt: the two-tower's columns (first), 0 without it
    graph_query: torch.Tensor | None  # float32 [I, G]: the graph filter's query table, None without it
    covariances: dict[str, torch.Tensor]  # "two_tower" / "graph_filter" -> float64 [D, D]; only for a fusion
    beta: float  # the fusion's weight of the graph part (1 without a fusion)
    unranked: torch.Tensor | None = None  # bool [I]: items never recommended (DotProductFit.unranked); None: none


def served_state(ranker: str, fit: DotProductFit, point: Point, split: EvalSplit) -> ServedState:
    """The served ranker's vectors at ``point`` from its test-stage ``fit``."""
    parts = [fit.first, fit.second] if isinstance(fit, FusionFit) else [fit]
    tt = next((p for p in parts if isinstance(p, TwoTowerFit)), None)
    gf = next((p for p in parts if isinstance(p, GraphFilterFit)), None)
    if len(parts) != int(tt is not None) + int(gf is not None) or (len(parts) == 2 and parts[0] is not tt):
        raise ValueError(f"{ranker}: the bundle serves two_tower, graph_filter and two_tower+graph_filter")
    columns, covariances = [], {}
    if tt is not None:
        columns.append(tt.items)
    graph_query = None
    if gf is not None:
        graph_query = gf.parts.query_table(point["alpha"])
        columns.append(torch.cat(gf.items(point["sharpen"]), dim=1))
    if len(parts) == 2:
        covariances = {"two_tower": item_covariance(columns[0]), "graph_filter": item_covariance(columns[1])}
    return ServedState(
        ranker=ranker,
        point=dict(point),
        item_vectors=torch.cat(columns, dim=1).contiguous(),
        two_tower_dim=int(tt.items.shape[1]) if tt is not None else 0,
        graph_query=graph_query,
        covariances=covariances,
        beta=float(point.get("beta", 1.0)),
        unranked=fit.unranked,
    )


def two_tower_state(item_embeddings: torch.Tensor, unranked: torch.Tensor | None = None) -> ServedState:
    """The two-tower alone (a run without served/, or other weights than the best epoch's); ``unranked``: bool [I],
    the items it leaves out (recsys/evaluation/untrained.py)."""
    return ServedState("two_tower", {}, item_embeddings.float(), int(item_embeddings.shape[1]), None, {}, 1.0, unranked)


def save_served(
    run_dir: Path, ranker: str, point: Point, fit: DotProductFit, split: EvalSplit, topk: np.ndarray
) -> Path:
    """Write ``<run_dir>/served/`` (module docstring) whole, replacing an earlier one."""
    state = served_state(ranker, fit, point, split)
    out = run_dir / SERVED_DIR
    tmp = run_dir / f".{SERVED_DIR}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tensors = {"item_vectors": state.item_vectors}
    if state.graph_query is not None:
        tensors["graph_query"] = state.graph_query
    tensors |= {f"covariance.{k}": v for k, v in state.covariances.items()}
    if state.unranked is not None:
        tensors["unranked"] = state.unranked.bool().cpu()
    torch.save(tensors, tmp / "vectors.pt")
    np.save(tmp / "test_topk.npy", np.ascontiguousarray(topk, dtype=np.int64))
    np.save(tmp / "test_users.npy", np.ascontiguousarray(split.users, dtype=np.int64))
    meta = {
        "ranker": ranker,
        "point": dict(point),
        "point_key": point_key(point),
        "two_tower_dim": state.two_tower_dim,
        "graph_dim": 0 if state.graph_query is None else int(state.graph_query.shape[1]),
        "beta": state.beta,
        "num_items": int(state.item_vectors.shape[0]),
        "fit_on": split.fit_on,
        "test_users": int(len(split.users)),
        "k": int(topk.shape[1]),
    }
    (tmp / "served.json").write_text(json.dumps(meta, indent=2))
    replace_dir(tmp, out)
    return out


def load_served(run_dir: Path) -> tuple[ServedState, dict]:
    """(the served state, served.json) of a run dir; FileNotFoundError naming the folder when it has none."""
    root = run_dir / SERVED_DIR
    meta_path = root / "served.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{root}: no served ranker (served.json); it is written by the evaluation stage of `python -m "
            "recsys.train` (runs from before it: train again, or export the two-tower alone with serve=two_tower)"
        )
    meta = json.loads(meta_path.read_text())
    tensors = torch_load_weights(root / "vectors.pt")
    state = ServedState(
        ranker=meta["ranker"],
        point=meta["point"],
        item_vectors=tensors["item_vectors"],
        two_tower_dim=int(meta["two_tower_dim"]),
        graph_query=tensors.get("graph_query"),
        covariances={k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith("covariance.")},
        beta=float(meta["beta"]),
        unranked=tensors.get("unranked"),
    )
    return state, meta


def served_ranking(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(test users int64 [U], the run's test top-k ids int64 [U, k]) of the served ranker."""
    root = run_dir / SERVED_DIR
    return numpy_load(root / "test_users.npy"), numpy_load(root / "test_topk.npy")
