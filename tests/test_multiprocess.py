"""Two processes under torchrun (gloo) follow the one-process run on the same global batches.

Each run goes through the real command line (``-m recsys.train +experiment=tiny``); the losses
are compared step by step from metrics.jsonl.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess

COMMON = [
    "+experiment=tiny",
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=12",
    "trainer.log_every_steps=1",
    "trainer.early_stopping_patience=0",
    "model.num_uniform_negatives=16",
    "sharding.device=cpu",
]


def run(run_dir, data_root, nproc, extra=()):
    overrides = [*COMMON, f"hydra.run.dir={run_dir}", f"data.root={data_root}", *extra]
    if nproc == 1:
        cmd = [sys.executable, "-m", "recsys.train", *overrides]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "recsys.train", *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    return losses, json.loads((run_dir / "results.json").read_text())


# 15944 training rows in batches of 1001: 15 odd-sized global batches (501 + 500 rows per rank)
# and a last one of 929; the first case runs one whole epoch, every example exactly once.
UNEVEN = ["trainer.global_batch_size=1001", "trainer.epochs=1", "trainer.max_steps_per_epoch=0"]


@pytest.mark.parametrize(
    "sharding,pipeline,extra,steps",
    [("table_wise", "none", UNEVEN, 16), ("column_wise", "sparse_dist", [], 24)],
    ids=["table_wise-uneven-full-epoch", "column_wise-pipeline"],
)
def test_two_ranks_follow_the_single_process_loss_curve(tmp_path, data_root, tiny_data, sharding, pipeline, extra, steps):
    single, single_results = run(tmp_path / "one", data_root, 1, [f"sharding={sharding}", *extra])
    double, double_results = run(tmp_path / "two", data_root, 2, [f"sharding={sharding}", f"trainer.pipeline={pipeline}", *extra])
    assert len(single) == len(double) == steps
    assert single[-1] < single[0]  # it learns
    for step, (a, b) in enumerate(zip(single, double)):
        assert b == pytest.approx(a, rel=2e-4, abs=2e-4), f"step {step}: 1 rank {a}, 2 ranks {b}"
    assert double_results["train"]["world_size"] == 2
    for model in ("two_tower", "popularity"):
        assert double_results["test"][model]["recall@20"] == pytest.approx(single_results["test"][model]["recall@20"], abs=5e-3)


def test_a_failing_rank_ends_the_job_instead_of_hanging(tmp_path, data_root, tiny_data):
    """Rank 0 fails while preparing data (the others wait in a collective): exit non-zero, promptly."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "recsys.train",
           "+experiment=tiny", "data=movielens_100k", f"data.root={tmp_path / 'empty'}", "data.movielens.download=false",
           f"hydra.run.dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)  # it hung for good before the fix
    assert proc.returncode != 0
    assert "put ml-100k.zip" in proc.stdout + proc.stderr


def test_ranks_reading_only_their_users_train_and_evaluate_like_the_whole_data(tmp_path, data_root, tiny_data):
    """data.shard_by_user on 2 ranks: a full epoch of uneven per-rank batches trains, and the metrics the
    ranks combine from their own users equal a one-process evaluation of the same checkpoint on the whole data."""
    run_dir = tmp_path / "sharded"
    losses, results = run(run_dir, data_root, 2, ["data.shard_by_user=true", "trainer.pipeline=sparse_dist", *UNEVEN])
    assert len(losses) == 16 and losses[-1] < losses[0]
    assert results["train"]["world_size"] == 2
    assert results["dataset"]["counts"]["train"] == len(tiny_data.splits["train"])  # whole-split counts, not a shard's
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "recsys.evaluate", f"run_dir={run_dir}", "ann_kinds=[]", "ease=false",
                           "ks=[10,20,50]"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    for split in ("valid", "test"):
        for model in ("two_tower", "popularity"):
            whole = report["splits"][split]["metrics"][model]
            for name, value in results[split][model].items():
                assert value == pytest.approx(whole[name], rel=1e-9, abs=1e-12), (split, model, name)
    assert results["test"]["two_tower"]["num_users_evaluated"] == 400
