"""The check every servable ranker's test makes: the exported bundle ranks the test users as the run did."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.job.plan import run_layout
from recsys.rankers.served_dir import served_ranking
from recsys.ranking.sharded import Evaluator


def assert_bundle_ranks_test_as_the_run(bundle, run_dir: Path, cfg, data) -> None:
    """``bundle.recommend_batch`` over each test user's whole train + valid history equals the run's served top 20."""
    users, run_topk = served_ranking(run_dir)
    evaluator = Evaluator(
        data, FeatureBuilder(data, layout=run_layout(cfg, data)), ks=[20], batch_size=64, chunk_size=64
    )
    test_users, _, _, timeline = evaluator.protocol("test")
    assert np.array_equal(test_users, users)
    lengths, items = latest_items(timeline, users, data.num_users, len(timeline))  # every train + valid item
    ids, _ = bundle.recommend_batch(np.split(items, np.cumsum(lengths)[:-1]), 20)
    assert np.array_equal(ids, run_topk[:, :20])
