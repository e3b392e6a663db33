"""Session fixtures: the tiny experiment's dataset, one in-process gloo group, one trained tiny run
(trained once, shared read-only: a test that changes it works on a copy), and the 2-rank trainings
of the multi-process tests, run in one torchrun launch. Helpers live in tests/helpers/."""

from __future__ import annotations

import os

# One OpenMP thread in this process, as launch() gives every child (tests/helpers/launch.py): the tiny
# model's tensors are too small for a second thread to help, and on a busy 2-core machine the threads
# spin waiting for each other (30 tiny training steps: 1.0 CPU s on 1 thread, 9-11 CPU s on 2).
os.environ["OMP_NUM_THREADS"] = "1"

# ruff: noqa: E402 (the imports follow the thread count: OpenMP reads it when torch loads)
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from recsys.config import Config
from tests.helpers.config import tiny_config
from tests.helpers.launch import launch
from tests.helpers.two_rank import JOBS

torch.set_num_threads(1)  # the same, should torch have been loaded before this file


@pytest.fixture
def root_logging():
    """Hydra's job logging (train.log) configured in this process by an entry point: the root logger as it was, after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """Prepared datasets shared by every test of the session (preparing is idempotent)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny_data(data_root):
    from data_pipelines.prepare import prepare_dataset
    from recsys.job.assemble import open_dataset

    cfg = tiny_config([f"data.root={data_root}"])
    return open_dataset(cfg, prepare_dataset(cfg.data))


@pytest.fixture(scope="session")
def process_group():
    """A one-process gloo group for in-process sharding tests (fit() reuses it, never closes it)."""
    from recsys.distributed.env import destroy_distributed, init_distributed

    env = init_distributed("cpu", "gloo")
    yield env
    destroy_distributed()


@dataclass(frozen=True)
class TrainedRun:
    run_dir: Path  # read-only: copy it (shutil.copytree) to change anything
    cfg: Config
    results: dict[str, Any]  # what fit() returned

    @property
    def bundle(self) -> Path:
        return self.run_dir / "export"


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_root, process_group) -> TrainedRun:
    """``+experiment=tiny`` trained to the end in this process, its config saved as ``python -m
    recsys.train`` saves it, and exported (``<run_dir>/export``): what evaluate / export / serving tests read."""
    from recsys.export import ExportConfig, export_run
    from recsys.job.run import fit
    from recsys.rankers.registry import DEFAULT_FUSION

    run_dir = tmp_path_factory.mktemp("trained") / "run"
    # the graph filter's fusion served, whichever fusion valid prefers (tests/serving/test_export.py checks its parts;
    # the choice on valid: tests/evaluation/test_served_choice.py)
    cfg = tiny_config([f"data.root={data_root}", f"eval.serve={DEFAULT_FUSION}"])
    results = fit(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    export_run(ExportConfig(run_dir=str(run_dir)))
    return TrainedRun(run_dir, cfg, results)


@pytest.fixture(scope="session")
def two_rank_runs(request, tmp_path_factory, data_root, tiny_data) -> dict[str, Path]:
    """Run dirs of the 2-rank trainings of tests/helpers/two_rank.py that this session's tests name
    (``@pytest.mark.two_rank_runs(...)``), all trained in one torchrun launch. Read-only."""
    names = sorted(
        {name for item in request.session.items for mark in item.iter_markers("two_rank_runs") for name in mark.args}
    )
    root = tmp_path_factory.mktemp("two_rank")
    jobs = [
        {
            "fit": [o.replace("{two_rank_root}", str(root)) for o in [*JOBS[name], f"data.root={data_root}"]],
            "run_dir": str(root / name),
        }
        for name in names
    ]
    (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
    launch(["tests/helpers/run_jobs.py", str(root / "jobs.json")], nproc=2)
    return {name: root / name for name in names}
