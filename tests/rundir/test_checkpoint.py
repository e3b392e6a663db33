"""Checkpoints in one process: resume equals an uninterrupted run, a broken write never wins."""

import json
import shutil

import pytest
from omegaconf import OmegaConf

import recsys.rundir.checkpoint as checkpoint_module
from recsys.job.run import fit
from recsys.rundir.checkpoint import (
    TrainerState,
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tests.helpers.checkpoints import assert_same_tensors, full_state
from tests.helpers.config import tiny_config

SHORT = ["trainer.max_steps_per_epoch=6", "trainer.early_stopping_patience=0", "model.negatives.num=8"]


def test_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, data_root, process_group):
    straight = tiny_config([f"data.root={data_root}", "trainer.epochs=2", *SHORT])
    fit(straight, tmp_path / "straight")
    first_half = tiny_config([f"data.root={data_root}", "trainer.epochs=1", "trainer.checkpoint_every_steps=4", *SHORT])
    fit(first_half, tmp_path / "resumed")
    fit(straight, tmp_path / "resumed")  # trainer.resume=auto picks up after epoch 0
    a = latest_checkpoint(tmp_path / "straight" / "checkpoints")
    b = latest_checkpoint(tmp_path / "resumed" / "checkpoints")
    assert a.name == b.name == "step_00000012"
    assert_same_tensors(full_state(a, tmp_path), full_state(b, tmp_path))
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("straight", "resumed")]
    assert results[0]["test"] == results[1]["test"]
    # the last two step checkpoints are kept (keep_last_checkpoints=2), plus best/
    assert [p.name for p in complete_checkpoints(tmp_path / "resumed" / "checkpoints")] == [
        "step_00000006",
        "step_00000012",
    ]


def test_resume_refuses_weights_of_another_model(tmp_path, data_root, process_group):
    fit(tiny_config([f"data.root={data_root}", "trainer.epochs=1", *SHORT]), tmp_path)
    # other tower widths: refused by the fingerprint before DCP meets tensors of other shapes
    with pytest.raises(ValueError, match="saved for another data/model config"):
        fit(tiny_config([f"data.root={data_root}", "trainer.epochs=2", "model.tower_dims=[24,8]", *SHORT]), tmp_path)
    # resume=none sets the old checkpoints aside (never deleting an earlier set) and starts over
    for n in (1, 2):
        fit(
            tiny_config(
                [
                    f"data.root={data_root}",
                    "trainer.epochs=1",
                    "model.loss.temperature=0.5",
                    "trainer.resume=none",
                    *SHORT,
                ]
            ),
            tmp_path,
        )
        assert (tmp_path / f"checkpoints.replaced.{n}" / "best" / "trainer_state.json").is_file()
    # each checkpoint carries the config its weights were trained with
    saved = OmegaConf.load(tmp_path / "checkpoints" / "best" / "config.yaml")
    assert saved.model.loss.temperature == 0.5

    # a checkpoint missing a DCP file, or holding a truncated one, is named as such before DCP reads it
    from recsys.rundir.checkpoint import check_checkpoint_files

    check_checkpoint_files(tmp_path / "checkpoints" / "best")
    for damage in ("delete", "truncate"):
        broken = tmp_path / f"broken_{damage}"
        shutil.copytree(tmp_path / "checkpoints" / "best", broken)
        data_file = next(broken.glob("*.distcp"))
        if damage == "delete":
            data_file.unlink()
            with pytest.raises(FileNotFoundError, match=f"incomplete checkpoint, {data_file.name} is missing"):
                check_checkpoint_files(broken)
        else:
            data_file.write_bytes(data_file.read_bytes()[:100])
            with pytest.raises(ValueError, match=f"incomplete checkpoint, {data_file.name} has 100 bytes"):
                check_checkpoint_files(broken)


def test_interrupted_write_leaves_the_previous_checkpoint_loadable(tmp_path, data_root, process_group, monkeypatch):
    from data_pipelines.prepare import prepare_dataset
    from recsys.distributed.sharding import shard_model
    from recsys.job.assemble import open_dataset
    from tests.helpers.run_task import run_task

    cfg = tiny_config([f"data.root={data_root}"])
    sharded = shard_model(
        run_task(cfg, open_dataset(cfg, prepare_dataset(cfg.data))),
        sharding=cfg.sharding,
        sparse=cfg.optim.sparse,
        dense=cfg.optim.dense,
        env=process_group,
        seed=0,
    )
    good = save_checkpoint(sharded, TrainerState(step=5), root=tmp_path, env=process_group)

    real_save = checkpoint_module.dcp.save

    def dying_save(state, checkpoint_id):
        real_save(state, checkpoint_id=checkpoint_id)  # files are on disk, the rename never happens
        raise KeyboardInterrupt("killed mid-checkpoint")

    monkeypatch.setattr(checkpoint_module.dcp, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(sharded, TrainerState(step=9), root=tmp_path, env=process_group)
    assert (tmp_path / "step_00000009.tmp").is_dir()
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(sharded, good, env=process_group).step == 5
