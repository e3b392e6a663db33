"""scripts/synthetic_oracle.py: the synthetic data's ceiling, the generator's own logits ranked as the evaluation ranks
(train and valid masked, test relevant)."""

import numpy as np
import pandas as pd
import pytest

from data_pipelines.prepare import prepare_dataset
from tests.helpers.config import tiny_config
from tests.helpers.scripts import load_script

synthetic_oracle = load_script("synthetic_oracle")


def test_the_generators_logits_rank_test_far_above_popularity(data_root):
    root = prepare_dataset(tiny_config([f"data.root={data_root}"]).data)
    out = synthetic_oracle.main([str(root), "--k", "20"])
    # popularity by train counts, the same masks and recall: the planted factors must do far better
    train, valid, test = (pd.read_parquet(root / f"{s}.parquet") for s in ("train", "valid", "test"))
    order = np.argsort(-np.bincount(train.item_id, minlength=300), kind="stable")
    seen = set(zip(pd.concat([train, valid]).user_id, pd.concat([train, valid]).item_id))
    recalls = []
    for user, items in test.groupby("user_id").item_id:
        top = [i for i in order if (user, i) not in seen][:20]
        recalls.append(len(set(top) & set(items)) / len(items))
    assert out["users"] == len(recalls)
    assert out["recall@20"] > 1.5 * np.mean(recalls) and 0 < out["ndcg@20"] <= 1


def test_a_dataset_that_is_not_synthetic_is_refused_naming_the_file(tmp_path):
    (tmp_path / "meta.json").write_text('{"num_users": 1}')
    with pytest.raises(ValueError, match=r"meta.json: no 'spec': not a synthetic dataset"):
        synthetic_oracle.main([str(tmp_path)])
