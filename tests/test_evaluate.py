"""`python -m recsys.evaluate` on a trained tiny run: the report is complete, and 1 and 2 ranks agree."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).resolve().parents[1]


def launch(args, nproc=1):
    prefix = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([*prefix, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, data_root, tiny_data):
    run_dir = tmp_path_factory.mktemp("trained")
    common = ["-m", "recsys.train", "+experiment=tiny", "trainer.epochs=2", "trainer.max_steps_per_epoch=15",
              f"hydra.run.dir={run_dir}", f"data.root={data_root}"]
    launch(common)
    # a second run in the same dir with other tower widths is refused, but Hydra has already rewritten
    # .hydra/config.yaml by then: evaluation must still rebuild the model the checkpoint holds
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    refused = subprocess.run([sys.executable, *common, "model.tower_dims=[24,8]"], env=env, capture_output=True, text=True,
                             timeout=600, cwd=ROOT)
    assert refused.returncode != 0 and "saved for another data/model config" in refused.stdout + refused.stderr
    assert list(OmegaConf.load(run_dir / ".hydra" / "config.yaml").model.tower_dims) == [24, 8]
    return run_dir


def test_report_from_one_and_two_ranks_is_identical(trained_run, tmp_path):
    args = ["-m", "recsys.evaluate", f"run_dir={trained_run}", "ann_kinds=[flat]", "ks=[10,20,50]"]
    proc = launch(args)
    assert f"report written to {trained_run / 'eval'}" in proc.stdout + proc.stderr
    for stage in ("loaded; embedding 300 items", "EASE: Gram matrix of 300 items", "valid: ranking", "test: ranking",
                  "FAISS: flat indexes"):  # a line per stage, not ~40 s of silence on the default run
        assert stage in proc.stdout, stage
    assert "Recall@20" in proc.stdout or "recall@20" in proc.stdout
    eval_dir = trained_run / "eval"
    one = json.loads((eval_dir / "report.json").read_text())
    for name in ("report.md", "recall_at_k.png", "recommendations.parquet"):
        assert (eval_dir / name).stat().st_size > 0, name
    recs = pd.read_parquet(eval_dir / "recommendations.parquet")
    assert recs.groupby("user_id").size().max() == 50
    full_report = (eval_dir / "report.json").read_bytes()

    # as if trained on GPUs (fused Adam, row-wise UVM-cached tables, NCCL): still loads on this CPU machine
    config_path = trained_run / "checkpoints" / "best" / "config.yaml"
    trained_config = config_path.read_text()
    gpu_config = OmegaConf.load(config_path)
    gpu_config.optim.sparse.name = "adam"
    gpu_config.sharding.backend = "nccl"
    gpu_config.sharding.tables = {"item": {"sharding_types": ["row_wise"], "compute_kernels": ["fused_uvm_caching"], "cache_load_factor": 0.2}}
    OmegaConf.save(gpu_config, config_path)
    try:
        launch([*args, f"out_dir={tmp_path / 'two'}"], nproc=2)  # out_dir: the report goes there instead of eval/
    finally:
        config_path.write_text(trained_config)
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    assert one["run"]["world_size"] == 1 and two["run"]["world_size"] == 2
    for split in ("valid", "test"):
        for model in ("two_tower", "popularity", "ease"):
            assert one["splits"][split]["metrics"][model] == two["splits"][split]["metrics"][model], (split, model)
    # the training run's own test numbers (same weights, same protocol) agree with the report's
    results = json.loads((trained_run / "results.json").read_text())
    assert results["test"]["two_tower"]["recall@20"] == pytest.approx(one["splits"]["test"]["metrics"]["two_tower"]["recall@20"], abs=1e-6)

    # max_users: a seeded sample of users, each ranked exactly as in the full evaluation, reported
    # beside the full report (never over it)
    full_recs = pd.read_parquet(eval_dir / "recommendations.parquet")
    launch(["-m", "recsys.evaluate", f"run_dir={trained_run}", "ann_kinds=[]", "ease=false", "ks=[10,20,50]", "max_users=40", "seed=3"],
           nproc=2)
    assert (eval_dir / "report.json").read_bytes() == full_report
    sample_dir = trained_run / "eval_sample_40_seed_3"
    sampled = json.loads((sample_dir / "report.json").read_text())
    sampled_recs = pd.read_parquet(sample_dir / "recommendations.parquet")
    for split in ("valid", "test"):
        assert sampled["splits"][split]["num_users"] == 40
        assert "uniform sample (seed 3) of 40 of the split's" in sampled["protocol"]["sentences"][split]
    users = sampled_recs["user_id"].unique()
    assert len(users) == 40 and set(users) <= set(full_recs["user_id"])
    cols = ["user_id", "rank", "item_id"]
    expected = full_recs[full_recs["user_id"].isin(users)][cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(sampled_recs[cols].reset_index(drop=True), expected)


def test_script_wrapper_finds_the_config(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/evaluate_recall.py", f"run_dir={tmp_path}", "ks=[5]", "--cfg", "job"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"run_dir: {tmp_path}" in proc.stdout and "- 5" in proc.stdout
