"""Several processes: a rank killed mid-epoch under torchrun --max-restarts ends bit-identical to an
uninterrupted run; a checkpoint saved on 2 ranks loads on 1 and on 3 (another plan) unchanged."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recsys.checkpoint import latest_checkpoint
from tests.test_checkpoint import assert_same_tensors, full_state

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).resolve().parents[1]
COMMON = [
    "+experiment=tiny",
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=10",
    "trainer.checkpoint_every_steps=4",
    "trainer.early_stopping_patience=0",
    "model.num_uniform_negatives=8",
    "model.query_user_id=true",  # all three tables (the tiny default's profile bag has no user table): more to reshard
]


def torchrun(nproc, args, *, max_restarts=0):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", f"--max-restarts={max_restarts}", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_root, tiny_data):
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    torchrun(2, ["-m", "recsys.train", *COMMON, f"hydra.run.dir={run_dir}", f"data.root={data_root}"])
    return run_dir


def test_killed_rank_restarts_from_checkpoint_and_ends_bit_identical(uninterrupted, tmp_path, data_root):
    run_dir = tmp_path / "killed"
    proc = torchrun(2, ["-m", "recsys.train", *COMMON, f"hydra.run.dir={run_dir}", f"data.root={data_root}",
                    "trainer.fault_at_step=14", "trainer.fault_rank=1"], max_restarts=1)
    assert "failed (exitcode: 13)" in proc.stderr  # torchrun's error line, and yet the job succeeded (README)
    log = (run_dir / "train.log").read_text()
    assert "fault injection: rank 1 exits after step 14" in log  # the injected death happened
    assert "resumed from" in log and "step_00000012" in log  # newest complete checkpoint before step 14
    a, b = latest_checkpoint(uninterrupted / "checkpoints"), latest_checkpoint(run_dir / "checkpoints")
    assert a.name == b.name == "step_00000020"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))
    results = [json.loads((d / "results.json").read_text()) for d in (uninterrupted, run_dir)]
    assert results[0]["test"] == results[1]["test"]


@pytest.mark.parametrize("nproc,sharding", [(1, "table_wise"), (3, "column_wise")])
def test_checkpoint_from_two_ranks_loads_on_other_world_sizes_and_plans(uninterrupted, tmp_path, data_root, nproc, sharding):
    saved = latest_checkpoint(uninterrupted / "checkpoints")
    torchrun(nproc, ["tests/helpers/reload_checkpoint.py", str(saved), str(tmp_path / "resaved"),
                     f"data.root={data_root}", f"sharding={sharding}", "model.num_uniform_negatives=8", "model.query_user_id=true"])
    resaved = latest_checkpoint(tmp_path / "resaved")
    original, reloaded = full_state(saved, tmp_path), full_state(resaved, tmp_path)
    assert_same_tensors(original["model"], reloaded["model"], "model")
    assert_same_tensors(original["optim"], reloaded["optim"], "optim")
    fused_states = [k for per_param in reloaded["optim"]["state"].values() for k in per_param if k.endswith("momentum1")]
    assert sorted(fused_states) == ["category.momentum1", "item.momentum1", "user.momentum1"]  # row-wise Adagrad state came along


def test_killed_rank_with_per_rank_data_also_ends_bit_identical(tmp_path, data_root):
    """data.shard_by_user: each rank's own shuffled order resumes at the saved batch just the same."""
    common = [*COMMON, "data.shard_by_user=true", f"data.root={data_root}"]
    torchrun(2, ["-m", "recsys.train", *common, f"hydra.run.dir={tmp_path / 'whole'}"])
    torchrun(2, ["-m", "recsys.train", *common, f"hydra.run.dir={tmp_path / 'killed'}",
             "trainer.fault_at_step=14", "trainer.fault_rank=0"], max_restarts=1)
    assert "resumed from" in (tmp_path / "killed" / "train.log").read_text()
    a, b = latest_checkpoint(tmp_path / "whole" / "checkpoints"), latest_checkpoint(tmp_path / "killed" / "checkpoints")
    assert a.name == b.name == "step_00000020"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))
