"""One table for a Hydra sweep: every job's overrides beside its valid / test metrics.

    $ python -m recsys.train -m +experiment=tiny run_name=temp model.loss.temperature=0.05,0.1,0.2

Jobs run in ``runs/<run_name>/<job number>/`` (``hydra.sweep`` in conf/config.yaml); this callback
(``hydra.callbacks`` there) rewrites ``runs/<run_name>/sweep.md`` and ``sweep.json`` after each job
and at the end, from each job's ``.hydra/overrides.yaml`` and ``results.json``. Only the jobs of the
current sweep are listed: a job dir left by an earlier, longer sweep under the same run_name is not.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from recsys.rundir.outputs import write_json_atomic

log = logging.getLogger(__name__)

MODEL = "two_tower"
SPLITS = ("valid", "test", "refit")  # "refit": the test figures of trainer.refit's second stage, when it ran
METRICS = ("recall", "ndcg")  # the results.json metrics the table shows, at every K the run reports


def collect_jobs(sweep_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """Job dirs (numbered) of the sweep, in job order; ``since``: only jobs started at or after this time."""
    jobs = []
    for job_dir in sweep_dir.iterdir() if sweep_dir.is_dir() else []:
        overrides = job_dir / ".hydra" / "overrides.yaml"
        if not (job_dir.name.isdigit() and overrides.is_file()):
            continue
        if since is not None and overrides.stat().st_mtime < since - 1:  # 1 s: file systems' coarse clocks
            continue
        results_path = job_dir / "results.json"
        results = json.loads(results_path.read_text()) if results_path.is_file() else None
        jobs.append(
            {
                "job": int(job_dir.name),
                "dir": str(job_dir),
                "overrides": list(OmegaConf.load(overrides)),
                "status": "done" if results else "no results.json (failed, or still running)",
                **{split: _metrics(results, split) for split in SPLITS},
            }
        )
    return sorted(jobs, key=lambda job: job["job"])


def _metrics(results: dict[str, Any] | None, split: str) -> dict[str, float] | None:
    if results is None:
        return None
    if split == "refit":
        return results["refit"]["test"][MODEL] if "refit" in results else None
    return results[split].get(MODEL)  # a run trained on its valid split has no valid figures


def format_summary(jobs: list[dict[str, Any]]) -> str:
    """Markdown: one row per job, the overrides it does not share with every other job, then the metrics."""
    common = set.intersection(*(set(job["overrides"]) for job in jobs)) if jobs else set()
    columns = sorted(
        {
            f"{split} {name}"
            for job in jobs
            for split in SPLITS
            for name in (job[split] or {})
            if name.split("@")[0] in METRICS
        },
        key=lambda c: (SPLITS.index(c.split()[0]), METRICS.index(c.split()[1].split("@")[0]), int(c.split("@")[1])),
    )
    lines = [
        f"sweep of {len(jobs)} jobs; every job: {' '.join(sorted(common)) or '(no shared overrides)'}",
        "",
        "| job | overrides | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for job in jobs:
        own = " ".join(o for o in job["overrides"] if o not in common) or "(none)"
        cells = [f"{job[c.split()[0]][c.split()[1]]:.4f}" if job[c.split()[0]] else "-" for c in columns]
        lines.append(f"| {job['job']} | {own} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: Path, since: float | None = None) -> Path:
    jobs = collect_jobs(sweep_dir, since)
    write_json_atomic(sweep_dir / "sweep.json", {"jobs": jobs})
    (sweep_dir / "sweep.md").write_text(format_summary(jobs))
    return sweep_dir / "sweep.md"


class SweepSummary(Callback):
    """Hydra callback: the sweep's summary after each job and at the end (rank 0 only under torchrun)."""

    def __init__(self) -> None:
        self._start: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start = time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN and _is_rank0():  # callbacks also run for a plain run
            write_summary(Path(config.hydra.sweep.dir), self._start)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if _is_rank0():
            path = write_summary(Path(config.hydra.sweep.dir), self._start)
            log.info("sweep summary: %s (and sweep.json)", path)
            print(path.read_text(), flush=True)


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0
