"""`python -m recsys.evaluate` on a trained tiny run: the report is complete, and 1 and 2 ranks agree."""

import io
import json
import logging
import runpy
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
import pytest
from omegaconf import OmegaConf

from tests.helpers.launch import ROOT, launch

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def run_copy(trained_run, tmp_path_factory, data_root):
    """The shared tiny run, copied (this module's evaluations write into it), after a refused training in it and an
    edit of its .hydra/config.yaml."""
    run_dir = tmp_path_factory.mktemp("evaluated") / "run"
    shutil.copytree(trained_run.run_dir, run_dir)
    # a second run in the same dir with other tower widths is refused, and leaves the run's .hydra/ as it was
    argv = [
        "recsys.train",
        "+experiment=tiny",
        f"hydra.run.dir={run_dir}",
        f"data.root={data_root}",
        "model.tower_dims=[24,8]",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]
    out = io.StringIO()
    with (
        pytest.MonkeyPatch.context() as mp,
        redirect_stdout(out),
        redirect_stderr(out),
        pytest.raises(SystemExit) as exited,
    ):
        mp.setattr(sys, "argv", argv)
        # the entry point leaves a variable that is set as it is: its allocator setting stays out of this process
        mp.setenv("THP_MEM_ALLOC_ENABLE", "0")
        runpy.run_module(
            "recsys.train", run_name="__main__", alter_sys=True
        )  # as `python -m recsys.train`, in this process
    logging.captureWarnings(
        False
    )  # its setup_logging() sent Python warnings to logging for good: give them back to pytest
    assert exited.value.code != 0 and "saved for another data/model config" in out.getvalue()
    hydra_config = run_dir / ".hydra" / "config.yaml"
    assert list(OmegaConf.load(hydra_config).model.tower_dims) == [32, 16]
    # edited by hand: evaluation must still rebuild the model the checkpoint holds (its own config.yaml)
    edited = OmegaConf.load(hydra_config)
    edited.model.tower_dims = [24, 8]
    OmegaConf.save(edited, hydra_config)
    assert list(OmegaConf.load(hydra_config).model.tower_dims) == [24, 8]
    return run_dir


def test_report_from_one_and_two_ranks_is_identical(run_copy, tmp_path):
    trained_run = run_copy
    args = ["-m", "recsys.evaluate", f"run_dir={trained_run}", "ann_kinds=[flat]", "ks=[10,20,50]"]
    proc = launch(args)
    assert f"report written to {trained_run / 'eval'}" in proc.stdout + proc.stderr
    for stage in (
        "loaded; embedding 300 items",
        "EASE: Gram matrix of 300 items",
        "valid: ranking",
        "test: ranking",
        "FAISS: flat indexes",
    ):  # a line per stage, not ~40 s of silence on the default run
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
    gpu_run = tmp_path / "gpu_run"
    shutil.copytree(trained_run, gpu_run)
    config_path = gpu_run / "checkpoints" / "best" / "config.yaml"
    gpu_config = OmegaConf.load(config_path)
    gpu_config.optim.sparse.name = "adam"
    gpu_config.sharding.backend = "nccl"
    gpu_config.sharding.tables = {
        "item": {"sharding_types": ["row_wise"], "compute_kernels": ["fused_uvm_caching"], "cache_load_factor": 0.2}
    }
    OmegaConf.save(gpu_config, config_path)
    # two evaluations on 2 ranks, one launch (tests/helpers/run_jobs.py): the GPU run's report to out_dir
    # (instead of eval/), and max_users: a seeded sample of users, each ranked exactly as in the full
    # evaluation, reported beside the full report (never over it)
    jobs = [
        {
            "evaluate": {
                "run_dir": str(gpu_run),
                "ann_kinds": ["flat"],
                "ks": [10, 20, 50],
                "out_dir": str(tmp_path / "two"),
            }
        },
        {
            "evaluate": {
                "run_dir": str(trained_run),
                "ann_kinds": [],
                "rankers": ["ials", "graph_filter", "two_tower+graph_filter"],
                "ks": [10, 20, 50],
                "max_users": 40,
                "seed": 3,
            }
        },
    ]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    launch(["tests/helpers/run_jobs.py", str(tmp_path / "jobs.json")], nproc=2)

    two = json.loads((tmp_path / "two" / "report.json").read_text())
    assert one["run"]["world_size"] == 1 and two["run"]["world_size"] == 2
    for split in ("valid", "test"):
        for model in ("two_tower", "popularity", "ease"):
            assert one["splits"][split]["metrics"][model] == two["splits"][split]["metrics"][model], (split, model)
    # the training run's own test numbers (same weights, same protocol) agree with the report's
    results = json.loads((trained_run / "results.json").read_text())
    assert results["test"]["two_tower"]["recall@20"] == pytest.approx(
        one["splits"]["test"]["metrics"]["two_tower"]["recall@20"], abs=1e-6
    )

    full_recs = pd.read_parquet(eval_dir / "recommendations.parquet")
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


def test_script_wrapper_finds_the_config(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["scripts/evaluate_recall.py", f"run_dir={tmp_path}", "ks=[5]", "--cfg", "job"])
    runpy.run_path(
        str(ROOT / "scripts" / "evaluate_recall.py"), run_name="__main__"
    )  # as `python scripts/evaluate_recall.py`
    out = capsys.readouterr().out
    assert f"run_dir: {tmp_path}" in out and "- 5" in out
