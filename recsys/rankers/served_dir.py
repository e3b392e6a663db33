"""``<run dir>/served/``: the served ranker (eval.serve) as the evaluation stage fit it for test, and its test ranking.

    served/            the served ranker (recsys/rankers/served.py: parts/, fusion/)
    served.json        the ranker, its chosen point, the parts' entries and weights, the test users' count and k
    test_topk.npy      int64 [U, k]: the run's test ranking of the served ranker (test_users.npy: its users)

``recsys.export`` builds the bundle from these, so the bundle ranks as the run did (tests/serving/test_export.py). Written to
a temporary folder and renamed into place. A run from before parts is read by recsys/rankers/legacy_served.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from recsys.rankers.legacy_served import read_legacy_served
from recsys.rankers.points import point_key
from recsys.rankers.served import Served
from recsys.utils.atomic import replace_dir
from recsys.utils.safe_load import numpy_load

SERVED_DIR = "served"


def save_served(
    run_dir: Path, ranker: str, point: dict, served: Served, *, fit_on: str, users: np.ndarray, topk: np.ndarray
) -> Path:
    """Write ``<run_dir>/served/`` (module docstring) whole, replacing an earlier one: the served ``ranker`` at its
    chosen ``point``, fit on ``fit_on``, and its test ranking ``topk`` [U, k] of ``users``."""
    out = run_dir / SERVED_DIR
    tmp = run_dir / f".{SERVED_DIR}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    layout = served.save(tmp)
    np.save(tmp / "test_topk.npy", np.ascontiguousarray(topk, dtype=np.int64))
    np.save(tmp / "test_users.npy", np.ascontiguousarray(users, dtype=np.int64))
    meta = {
        "ranker": ranker,
        "point": dict(point),
        "point_key": point_key(point),
        **layout,
        "num_items": int(served.items().shape[0]),
        "fit_on": fit_on,
        "test_users": int(len(users)),
        "k": int(topk.shape[1]),
    }
    (tmp / "served.json").write_text(json.dumps(meta, indent=2))
    replace_dir(tmp, out)
    return out


def load_served(run_dir: Path) -> tuple[Served, dict]:
    """(the served ranker, served.json) of a run dir; FileNotFoundError naming the folder when it has none."""
    root = run_dir / SERVED_DIR
    meta_path = root / "served.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{root}: no served ranker (served.json); it is written by the evaluation stage of `python -m "
            "recsys.train` (runs from before it: train again, or export the two-tower alone with serve=two_tower)"
        )
    meta = json.loads(meta_path.read_text())
    if "parts" not in meta:  # a run from before parts: read its fixed files
        return read_legacy_served(root, meta), meta
    return Served.load(root, meta, str(meta_path)), meta


def served_ranking(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(test users int64 [U], the run's test top-k ids int64 [U, k]) of the served ranker."""
    root = run_dir / SERVED_DIR
    return numpy_load(root / "test_users.npy"), numpy_load(root / "test_topk.npy")
