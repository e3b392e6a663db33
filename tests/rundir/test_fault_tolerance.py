"""Several processes: a rank killed mid-epoch under torchrun --max-restarts ends bit-identical to an
uninterrupted run, with one torchrun agent or with two (two "hosts"); a checkpoint saved on 2 ranks
loads on 1 and on 3 (another plan) unchanged.

The uninterrupted 2-rank runs come from the ``two_rank_runs`` launch (tests/helpers/two_rank.py);
the killed ones run through the real command line, as a preempted job would be restarted."""

import json
from pathlib import Path

import pytest

from recsys.rundir.checkpoint import latest_checkpoint
from tests.helpers.checkpoints import assert_same_tensors, full_state
from tests.helpers.launch import launch, launch_agents
from tests.helpers.reload_checkpoint import reload_checkpoint
from tests.helpers.two_rank import FAULT_TOLERANCE

pytestmark = pytest.mark.multiprocess
COMMON = ["+experiment=tiny", *FAULT_TOLERANCE]
SCALE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "training-at-scale.md"


@pytest.mark.two_rank_runs("uninterrupted")
def test_killed_rank_restarts_from_checkpoint_and_ends_bit_identical(two_rank_runs, tmp_path, data_root):
    uninterrupted, run_dir = two_rank_runs["uninterrupted"], tmp_path / "killed"
    proc = launch(
        [
            "-m",
            "recsys.train",
            *COMMON,
            f"hydra.run.dir={run_dir}",
            f"data.root={data_root}",
            "trainer.fault_at_step=14",
            "trainer.fault_rank=1",
        ],
        nproc=2,
        max_restarts=1,
    )
    assert "failed (exitcode: 13)" in proc.stderr  # torchrun's error line, and yet the job succeeded (docs)
    log = (run_dir / "train.log").read_text()
    assert "fault injection: rank 1 exits after step 14" in log  # the injected death happened
    assert "resumed from" in log and "step_00000012" in log  # newest complete checkpoint before step 14
    a, b = latest_checkpoint(uninterrupted / "checkpoints"), latest_checkpoint(run_dir / "checkpoints")
    assert a.name == b.name == "step_00000020"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))
    results = [json.loads((d / "results.json").read_text()) for d in (uninterrupted, run_dir)]
    assert results[0]["test"] == results[1]["test"]


@pytest.mark.two_rank_runs("uninterrupted")
@pytest.mark.parametrize("nproc,sharding", [(1, "table_wise"), (3, "column_wise")])
def test_checkpoint_from_two_ranks_loads_on_other_world_sizes_and_plans(
    two_rank_runs, tmp_path, data_root, process_group, nproc, sharding
):
    saved = latest_checkpoint(two_rank_runs["uninterrupted"] / "checkpoints")
    overrides = [
        f"data.root={data_root}",
        f"sharding={sharding}",
        "model.negatives.num=8",
        "model.query_user_id=true",
    ]
    if nproc == 1:  # this process's one-rank group
        reload_checkpoint(saved, tmp_path / "resaved", overrides, process_group)
    else:
        launch(["tests/helpers/reload_checkpoint.py", str(saved), str(tmp_path / "resaved"), *overrides], nproc=nproc)
    resaved = latest_checkpoint(tmp_path / "resaved")
    original, reloaded = full_state(saved, tmp_path), full_state(resaved, tmp_path)
    assert_same_tensors(original["model"], reloaded["model"], "model")
    assert_same_tensors(original["optim"], reloaded["optim"], "optim")
    fused_states = [
        k for per_param in reloaded["optim"]["state"].values() for k in per_param if k.endswith("momentum1")
    ]
    assert sorted(fused_states) == [
        "category.momentum1",
        "item.momentum1",
        "neighbor.momentum1",
        "user.momentum1",
    ]  # row-wise Adagrad state came along


@pytest.mark.two_rank_runs("uninterrupted_by_user")
def test_killed_rank_with_per_rank_data_also_ends_bit_identical(two_rank_runs, tmp_path, data_root):
    """data.shard_by_user: each rank's own shuffled order resumes at the saved batch just the same."""
    whole = two_rank_runs["uninterrupted_by_user"]
    launch(
        [
            "-m",
            "recsys.train",
            *COMMON,
            "data.shard_by_user=true",
            f"data.root={data_root}",
            f"hydra.run.dir={tmp_path / 'killed'}",
            "trainer.fault_at_step=14",
            "trainer.fault_rank=0",
        ],
        nproc=2,
        max_restarts=1,
    )
    assert "resumed from" in (tmp_path / "killed" / "train.log").read_text()
    a, b = latest_checkpoint(whole / "checkpoints"), latest_checkpoint(tmp_path / "killed" / "checkpoints")
    assert a.name == b.name == "step_00000020"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))


@pytest.mark.two_rank_runs("uninterrupted")
def test_killed_rank_on_one_of_two_hosts_restarts_and_ends_bit_identical(two_rank_runs, tmp_path, data_root):
    """Issue 14 item 16: docs/training-at-scale.md's multi-host command as two torchrun agents here, one worker each.

    The agent whose worker dies counts a restart; the other restarts its healthy worker without counting
    one, so restart counts differ between agents and the restarted workers cannot namespace the agents'
    shared store by them: the command sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a new store per attempt).
    The agents run with the documented command's environment, so the test fails if the page drops it.
    """
    command = next(line for line in SCALE_PAGE.read_text().splitlines() if "torchrun --nnodes" in line)
    documented_env = dict(word.split("=", 1) for word in command[: command.index(".venv/bin/torchrun")].split())
    assert documented_env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    run_dir = tmp_path / "killed"
    agents = launch_agents(
        [
            "-m",
            "recsys.train",
            *COMMON,
            f"hydra.run.dir={run_dir}",
            f"data.root={data_root}",
            "trainer.fault_at_step=14",
            "trainer.fault_rank=1",
        ],
        max_restarts=1,
        env=documented_env,
    )
    assert sum("failed (exitcode: 13)" in a.stdout for a in agents) == 1  # one agent's worker died, once
    log = (run_dir / "train.log").read_text()
    assert "fault injection: rank 1 exits after step 14" in log
    assert "resumed from" in log and "step_00000012" in log  # the newest complete checkpoint before step 14
    a, b = latest_checkpoint(two_rank_runs["uninterrupted"] / "checkpoints"), latest_checkpoint(run_dir / "checkpoints")
    assert a.name == b.name == "step_00000020"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))
    results = [json.loads((d / "results.json").read_text()) for d in (two_rank_runs["uninterrupted"], run_dir)]
    assert results[0]["test"] == results[1]["test"]


def test_two_agents_sharing_a_store_across_restarts_are_refused_naming_the_setting(monkeypatch):
    """What the two agents above do without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: refused before any work,
    instead of a restart that fails (gloo connectFullMesh: Connection refused) or hangs."""
    from recsys.distributed.env import _attempt_store

    # what each agent tells its worker (a process group joined through this store would hang at the restart)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    with pytest.raises(
        RuntimeError, match=r"2 agents \(--nnodes\) with --max-restarts=1 .* TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    ):
        _attempt_store(world_size=2)  # before connecting to anything
