"""A run dir's record (``.hydra/``: config.yaml, overrides.yaml, hydra.yaml) describes the run that was run there
(issue 43 item 4): a finished run asked for other evaluation settings is refused naming them, and neither it, a run
already complete, nor a second run refused in a shared ``hydra.run.dir`` rewrites the record."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.helpers.entry_points import QUIET, files, one_error_line, run_module

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]


@pytest.fixture
def finished_run(tmp_path, data_root, process_group, monkeypatch, capsys):
    """A finished tiny run by `python -m recsys.train`, with its record and results."""
    run_dir = tmp_path / "run"
    args = ["+experiment=tiny", f"data.root={data_root}", *SHORT, f"hydra.run.dir={run_dir}", *QUIET]
    assert run_module(monkeypatch, "recsys.train", args) == 0
    capsys.readouterr()
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").eval.serve == ""
    return run_dir, args


def test_changed_eval_settings_on_a_finished_run_are_refused_naming_them_and_its_record_is_kept(
    finished_run, monkeypatch, capsys
):
    run_dir, args = finished_run
    record, results = files(run_dir / ".hydra"), (run_dir / "results.json").read_bytes()
    changed = ["eval.serve=two_tower", "eval.ks=[10,20]", "eval.batch_size=64"]
    assert run_module(monkeypatch, "recsys.train", [*args, *changed]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run_dir}: this run is complete and its evaluation used other settings: ")
    assert "eval.serve=two_tower (the run's: '')" in line and "eval.ks=[10, 20] (the run's: [10, 20, 50])" in line
    assert "batch_size" not in line  # how the stage batches its work changes no figure
    assert "trainer.resume=none" in line and "run_name" in line
    assert files(run_dir / ".hydra") == record and (run_dir / "results.json").read_bytes() == results

    # the same settings, or only ones that change no figure: already complete (its results printed again, nothing
    # trained), the record as it was
    assert run_module(monkeypatch, "recsys.train", [*args, "eval.batch_size=64", "trainer.log_every_steps=2"]) == 0
    assert "train: 4 steps" in capsys.readouterr().out
    assert files(run_dir / ".hydra") == record and (run_dir / "results.json").read_bytes() == results


def test_a_second_run_refused_in_a_shared_run_dir_keeps_the_first_ones_record(finished_run, monkeypatch, capsys):
    run_dir, args = finished_run
    record = files(run_dir / ".hydra")
    second = [*args, "run_name=b", "model.tower_dims=[24,16]"]  # the same hydra.run.dir, another run_name and model
    assert run_module(monkeypatch, "recsys.train", second) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "saved for another data/model config" in line
    assert "hydra.run.dir" in line  # another run_name alone would not change a run dir set by hand
    assert files(run_dir / ".hydra") == record
    overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
    assert "run_name=b" not in overrides and json.loads((run_dir / "results.json").read_text())["train"]["steps"] == 4
