"""Planner dry runs (scripts/plan_sharding.py): meta device, declared Topology, no process group."""

from __future__ import annotations

import json
import runpy
import sys
from dataclasses import dataclass

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recsys.config import PlanConfig, reject_unknown_keys
from recsys.config import register_configs as register_plan_configs
from recsys.distributed.dry_run import GB, plan_dry_run
from tests.helpers.launch import ROOT, launch

SCRIPT = ROOT / "scripts" / "plan_sharding.py"


@dataclass
class ScriptRun:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_script(monkeypatch, capsys):
    """``python scripts/plan_sharding.py OVERRIDES`` in this process (no torch import to pay again): exit status and output."""

    def run(*overrides: str) -> ScriptRun:
        monkeypatch.setenv(
            "PYTHONHASHSEED", "0"
        )  # what the script re-executes itself with otherwise (it pins the seed)
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *overrides])
        capsys.readouterr()
        try:
            runpy.run_path(str(SCRIPT), run_name="__main__")
            code = 0
        except SystemExit as exited:
            code = exited.code
        out, err = capsys.readouterr()
        return ScriptRun(code, out, err)

    return run


def last_json(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plan_config(overrides: list[str]) -> PlanConfig:
    register_plan_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="plan", overrides=overrides)
    reject_unknown_keys(cfg)
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, PlanConfig)
    return obj


def test_64_gpu_example_spreads_the_billion_row_table_over_every_rank(run_script):
    proc = run_script("+plan_example=64x80gb_user_1e9")
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)
    assert out["fits"] is True
    assert out["tables"]["user"]["sharding_type"] == "row_wise"
    assert out["tables"]["user"]["ranks"] == list(range(64))
    assert set(out["tables"]) == {"user", "item", "category"}
    # 10^9 x 128 fp32 = 477 GB over 64 ranks, ~7.5 GB each, plus the item table's shards on host 0
    assert 7.0 < out["max_rank_hbm_gb"] <= 80
    assert out["max_rank_ddr_gb"] == 0.0  # fused kernels keep everything in HBM


def test_impossible_cluster_reports_no_fit_and_names_the_table(run_script):
    proc = run_script(
        "+plan_example=64x80gb_user_1e9", "cluster.world_size=2", "cluster.local_world_size=2", "cluster.hbm_gb=1"
    )
    assert proc.returncode == 1, proc.stderr
    out = last_json(proc)
    assert out["fits"] is False
    assert out["tables"] == {}
    assert "'user'" in out["reason"] and "larger than the whole cluster" in out["reason"]
    assert "DOES NOT FIT" in proc.stdout


def test_typo_in_a_cluster_key_fails_with_hydras_error(run_script):
    proc = run_script("cluster.hbm_gbb=1")
    assert proc.returncode == 1
    assert "Key 'hbm_gbb' not in 'ClusterConfig'" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("key", ["cluster.hbm_gbb", "model.tables.user.embedding_dimm", "num_rows.users"])
def test_a_typo_appended_with_plus_fails_too(key):
    register_plan_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="plan", overrides=[f"+{key}=1"])
    with pytest.raises(ValueError, match=f"full_key: {key}"):
        reject_unknown_keys(cfg)


@pytest.mark.parametrize("example", ["64x80gb_user_1e9", "8x80gb_item_1e8"])
def test_per_rank_memory_adds_up_to_the_tables(example):
    report = plan_dry_run(plan_config([f"+plan_example={example}"]))
    assert report.fits
    assert len(report.ranks) == report.cluster.world_size
    table_bytes = sum(report.table_bytes.values())
    hbm = sum(r.hbm_bytes for r in report.ranks)
    # weights, plus rowwise adagrad's one float per row and the lookup buffers: a few % more
    assert table_bytes <= hbm <= 1.1 * table_bytes
    assert all(r.hbm_bytes <= report.usable_hbm_bytes for r in report.ranks)
    # every rank the plan names for a table holds some of it, and nothing else holds any
    for name, t in report.tables.items():
        assert {r for r, use in enumerate(report.ranks) if name in use.tables} == set(t.ranks)
    assert report.summary()["max_rank_hbm_gb"] == round(max(r.hbm_bytes for r in report.ranks) / GB, 3)


def test_default_planner_keeps_the_user_table_inside_one_host():
    """What the 64-GPU example's row_wise constraint is for (see scripts/plan_sharding.py)."""
    report = plan_dry_run(plan_config(["+plan_example=64x80gb_user_1e9", "sharding.tables.user.sharding_types=[]"]))
    assert report.fits
    assert len(report.tables["user"].ranks) < 64


def test_dry_run_prints_the_same_plan_whatever_the_callers_hash_seed():
    """Equal-cost options tie in torchrec's set-ordered enumerator; in-process, hash seeds 1 and 2 label
    the 8 x 80 GB plan table_wise and table_column_wise. The script pins the seed: one answer."""
    outputs = []
    for seed in ("1", "2"):
        proc = launch([str(SCRIPT), "+plan_example=8x80gb_item_1e8"], timeout=300, env={"PYTHONHASHSEED": seed})
        outputs.append(last_json(proc))
    assert outputs[0] == outputs[1]
    assert outputs[0]["tables"]["item"]["sharding_type"] == "table_wise"


def test_side_feature_tables_are_planned_with_their_rows():
    report = plan_dry_run(plan_config(["+model/side=movielens_items", "+num_rows.side.year=13"]))
    assert report.fits and report.table_bytes["year"] == 13 * 8 * 4  # rows x dim x fp32


def test_a_side_table_without_rows_is_named():
    with pytest.raises(ValueError, match=r"num_rows.side.year=0 must be >= 1"):
        plan_dry_run(plan_config(["+model/side=movielens_items"]))
