"""The synthetic dataset's ceiling: test Recall@K and NDCG@K of the generator's own sampling logits (U.V / T + the
items' popularity bias, data_pipelines/synthetic.py), ranked as the evaluation ranks (each user's train and valid
items masked, the test items relevant; Recall = hits / the user's test items). What a model's figure on the synthetic
default is measured against (docs/quality.md, "The synthetic default").

$ python scripts/synthetic_oracle.py data/synthetic-<key> --k 20
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from data_pipelines.synthetic import SyntheticSpec, generate


def oracle_metrics(dataset_dir: Path, k: int = 20, chunk: int = 1024) -> dict[str, float]:
    """{"recall@k", "ndcg@k", "users"} of the true logits on the prepared synthetic dataset in ``dataset_dir``."""
    meta = json.loads((dataset_dir / "meta.json").read_text())
    if "spec" not in meta:
        raise ValueError(f"{dataset_dir / 'meta.json'}: no 'spec': not a synthetic dataset")
    *_, factors = generate(SyntheticSpec(**meta["spec"]), return_factors=True)
    splits = {s: pd.read_parquet(dataset_dir / f"{s}.parquet", columns=["user_id", "item_id"]) for s in SPLITS}
    num_users = meta["num_users"]
    recalls, ndcgs = [], []
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    for start in range(0, num_users, chunk):
        users = np.arange(start, min(start + chunk, num_users))
        scores = factors.logits(users)
        relevant = np.zeros_like(scores, dtype=bool)
        for name, rows in splits.items():
            rows = rows[(rows.user_id >= users[0]) & (rows.user_id <= users[-1])]
            if name == "test":
                relevant[rows.user_id - start, rows.item_id] = True
            else:  # never recommended: what the user already has
                scores[rows.user_id - start, rows.item_id] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: the lower item id, as the evaluation
        hits = np.take_along_axis(relevant, top, axis=1)
        counts = relevant.sum(1)
        held = counts > 0
        recalls.append(hits.sum(1)[held] / counts[held])
        ideal = np.cumsum(discounts)[np.minimum(counts[held], k) - 1]
        ndcgs.append((hits[held] * discounts).sum(1) / ideal)
    recall, ndcg = np.concatenate(recalls), np.concatenate(ndcgs)
    return {f"recall@{k}": float(recall.mean()), f"ndcg@{k}": float(ndcg.mean()), "users": int(len(recall))}


SPLITS = ("train", "valid", "test")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset_dir", type=Path, help="a prepared synthetic dataset (data/synthetic-<key>)")
    parser.add_argument("--k", type=int, default=20)
    args = parser.parse_args(argv)
    out = oracle_metrics(args.dataset_dir, args.k)
    print(f"the generator's logits on test ({out['users']} users): " + ", ".join(
        f"{key} {value:.4f}" for key, value in out.items() if key != "users"))  # fmt: skip
    return out


if __name__ == "__main__":
    main()
