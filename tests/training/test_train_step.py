"""torchrec's TrainPipelineSparseDist gives exactly the plain loop's training, on CPU with gloo."""

import json

import pytest

from recsys.job.run import fit
from recsys.rundir.checkpoint import latest_checkpoint
from tests.helpers.checkpoints import assert_same_tensors, full_state
from tests.helpers.config import tiny_config


def losses(run_dir):
    return [
        json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]


def test_sparse_dist_pipeline_equals_plain_loop(tmp_path, data_root, process_group):
    common = [
        f"data.root={data_root}",
        "trainer.epochs=2",
        "trainer.max_steps_per_epoch=9",
        "trainer.log_every_steps=1",
        "trainer.checkpoint_every_steps=4",
        "trainer.early_stopping_patience=0",
        "model.negatives.num=8",
    ]
    plain = fit(tiny_config([*common, "trainer.pipeline=none"]), tmp_path / "plain")
    piped = fit(tiny_config([*common, "trainer.pipeline=sparse_dist"]), tmp_path / "piped")
    assert losses(tmp_path / "plain") == losses(tmp_path / "piped") and len(losses(tmp_path / "plain")) == 18
    assert plain["test"] == piped["test"]
    a, b = (latest_checkpoint(tmp_path / d / "checkpoints") for d in ("plain", "piped"))
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))


def test_bf16_precision_runs_under_autocast_in_both_loops(tmp_path, data_root, process_group):
    """trainer.precision=bf16: the plain loop and the pipeline train identically under autocast, on a
    curve within bf16 rounding of fp32's (not on it: the matmuls did run in bf16)."""
    common = [
        f"data.root={data_root}",
        "trainer.epochs=1",
        "trainer.max_steps_per_epoch=8",
        "trainer.log_every_steps=1",
        "trainer.early_stopping_patience=0",
    ]
    fit(tiny_config([*common, "trainer.pipeline=none"]), tmp_path / "fp32")
    for pipeline in ("none", "sparse_dist"):
        fit(tiny_config([*common, f"trainer.pipeline={pipeline}", "trainer.precision=bf16"]), tmp_path / pipeline)
    fp32, plain, piped = (losses(tmp_path / d) for d in ("fp32", "none", "sparse_dist"))
    assert plain == piped and len(plain) == 8
    assert plain != fp32
    assert plain == pytest.approx(fp32, rel=1e-2)


def test_unknown_pipeline_is_refused(tmp_path, data_root, process_group):
    with pytest.raises(ValueError, match="trainer.pipeline='fused': expected 'none' or 'sparse_dist'"):
        fit(tiny_config([f"data.root={data_root}", "trainer.pipeline=fused"]), tmp_path)
