"""`-m` sweeps: jobs in runs/<run_name>/<n>, one summary table of overrides and metrics; a quiet console."""

import json
import os

from hydra.types import RunMode
from omegaconf import OmegaConf

from recsys.job.sweep_summary import SweepSummary, collect_jobs, format_summary
from tests.helpers.launch import launch

LIBRARY_CHATTER = (
    "Planner Statistics",
    "TBE=",
    "faiss",
    "FutureWarning",
    "UserWarning",
    "known issue",
    "is_fx_tracing",
    "ERROR",
    "Traceback",
)


def test_sweep_jobs_land_in_the_run_dir_with_one_summary(tmp_path, data_root):
    out = launch(
        [
            "-m",
            "recsys.train",
            "-m",
            "+experiment=tiny",
            "run_name=sw",
            f"data.root={data_root}",
            "trainer.epochs=1",
            "trainer.max_steps_per_epoch=3",
            "model.loss.temperature=0.05,0.1",
        ],
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    console = out.stdout + out.stderr
    assert out.returncode == 0, console
    sweep = tmp_path / "runs" / "sw"
    assert not (tmp_path / "multirun").exists()
    results = [json.loads((sweep / str(n) / "results.json").read_text()) for n in (0, 1)]

    summary = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [job["job"] for job in summary] == [0, 1]
    assert (
        "model.loss.temperature=0.05" in summary[0]["overrides"]
        and "model.loss.temperature=0.1" in summary[1]["overrides"]
    )
    assert [job["test"] for job in summary] == [r["test"]["two_tower"] for r in results]
    table = (sweep / "sweep.md").read_text()
    assert "| job | overrides | valid recall@10 | valid recall@20 |" in table
    row = next(line for line in table.splitlines() if line.startswith("| 1 | model.loss.temperature=0.1 |"))
    assert f"{results[1]['valid']['two_tower']['recall@10']:.4f}" == row.split(" | ")[2]
    assert table in console  # printed at the end as well

    # the console holds recsys's own lines only: none of torchrec's, fbgemm's, faiss' or torch's
    for chatter in LIBRARY_CHATTER:
        assert chatter not in console, chatter
    log = (sweep / "0" / "train.log").read_text()
    assert "Planner Statistics" in log  # kept in the log file
    assert (
        "CPU allocator: " in log
    )  # what the entry point set (recsys/utils/cpu_memory.py; tests/scripts/test_cpu_memory.py)

    # a later, shorter sweep under the same run_name lists its own jobs only (job 0 dated a minute back:
    # 3-step jobs now start within the 1 s that collect_jobs allows for coarse file-system clocks)
    job0 = sweep / "0" / ".hydra" / "overrides.yaml"
    os.utime(job0, (job0.stat().st_atime - 60, job0.stat().st_mtime - 60))
    assert len(collect_jobs(sweep, since=(sweep / "1" / ".hydra" / "overrides.yaml").stat().st_mtime)) == 1

    # the table is rewritten after each job of a sweep (a failed job stops Hydra's sweep: the jobs done so far
    # stay listed), and never by a plain run
    (sweep / "sweep.md").unlink()
    callback = SweepSummary()
    callback.on_job_end(
        OmegaConf.create({"hydra": {"mode": RunMode.RUN, "sweep": {"dir": str(sweep)}}}), job_return=None
    )
    assert not (sweep / "sweep.md").exists()
    callback.on_job_end(
        OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep)}}}), job_return=None
    )
    assert (sweep / "sweep.md").read_text() == table


def test_the_summary_shows_the_refit_stage_and_runs_without_valid(tmp_path):
    """A job with trainer.refit=true gets its refit test figures as "refit" columns; a job trained on its
    valid split (data.train_on_valid=true) has no valid figures, shown as "-"."""
    figures = {"recall@20": 0.25, "ndcg@20": 0.125}
    jobs = {
        0: ["trainer.refit=true"],
        1: ["data.train_on_valid=true"],
    }
    results = {
        0: {
            "valid": {"two_tower": figures},
            "test": {"two_tower": figures},
            "refit": {"valid": {}, "test": {"two_tower": {"recall@20": 0.5, "ndcg@20": 0.375}}},
        },
        1: {"valid": {}, "test": {"two_tower": figures}},
    }
    for n, overrides in jobs.items():
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
        (tmp_path / str(n) / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        (tmp_path / str(n) / "results.json").write_text(json.dumps(results[n]))
    collected = collect_jobs(tmp_path)
    assert collected[0]["refit"] == {"recall@20": 0.5, "ndcg@20": 0.375} and collected[1]["refit"] is None
    table = format_summary(collected).splitlines()
    assert table[2] == (
        "| job | overrides | valid recall@20 | valid ndcg@20 | test recall@20 | test ndcg@20 | refit recall@20 | refit ndcg@20 |"
    )
    assert table[4] == "| 0 | trainer.refit=true | 0.2500 | 0.1250 | 0.2500 | 0.1250 | 0.5000 | 0.3750 |"
    assert table[5] == "| 1 | data.train_on_valid=true | - | - | 0.2500 | 0.1250 | - | - |"
