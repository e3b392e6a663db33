"""scripts/bench_eval.py's plumbing on CPU: its figures, and the device path's side-by-side it runs on a GPU."""

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk
from tests.helpers.scripts import load_script

bench = load_script("bench_eval")


def test_bench_eval_reports_its_ratio():
    out = bench.main(["--num-users", "300", "--num-items", "1500", "--k", "10", "--chunk-size", "64"])
    assert out["users_per_s"] > 0 and out["ratio_vs_matmul"] > 0 and out["peak_rss_mb"] > 0
    assert "ratio_vs_matmul_whole_row_topk" not in out  # a GPU figure: the device path is not the CPU's


def test_whole_row_side_by_side_checks_its_ids_against_the_run():
    """What bench_eval times on a GPU beside exact_topk: the device path with whole-row candidates, its ids checked
    equal to exact_topk's (here the host path's, on CPU); other ids stop the bench."""
    rng = np.random.default_rng(0)
    queries, items = torch.randn(200, 8), torch.randn(1500, 8)
    exclude = UserItemCSR.from_pairs(
        np.repeat(np.arange(200), 20), rng.integers(0, 1500, 4000), num_users=200, num_items=1500
    )
    args = bench.parse_args(["--k", "10", "--chunk-size", "64"])
    _, ids = exact_topk(queries, items, 10, exclude=exclude, chunk_size=64)
    assert bench.whole_row_topk(queries, items, args, exclude, ids) > 0
    try:
        bench.whole_row_topk(queries, items, args, exclude, ids.flip(1))
    except SystemExit as e:
        assert "ids differ" in str(e)
    else:
        raise AssertionError("whole_row_topk accepted ids that differ")
