"""A run dir never mixes two runs and never silently repeats one: resume=auto on a finished run, resume=none."""

import json
import logging

from recsys.job.run import fit
from recsys.rundir.checkpoint import TrainerState, latest_checkpoint
from recsys.rundir.dir import is_finished
from tests.helpers.config import tiny_config

SHORT = ["trainer.max_steps_per_epoch=6", "trainer.early_stopping_patience=0", "model.negatives.num=8"]


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_finished_run_is_not_retrained_and_starting_over_sets_its_logs_aside(
    tmp_path, data_root, process_group, caplog
):
    caplog.set_level(logging.INFO, logger="recsys")
    config = lambda *extra: tiny_config([f"data.root={data_root}", *SHORT, *extra])  # noqa: E731
    first = fit(config("trainer.epochs=1"), tmp_path)
    num_records = len(_records(tmp_path / "metrics.jsonl"))

    # resume=auto on a finished run: no step, no new record or checkpoint, the saved results
    caplog.clear()
    again = fit(config("trainer.epochs=1"), tmp_path)
    assert again == json.loads(json.dumps(first))
    assert "run already complete (results from " in caplog.text and "resumed from" not in caplog.text
    assert len(_records(tmp_path / "metrics.jsonl")) == num_records
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000006"

    # more epochs asked for: trains on from the last checkpoint
    fit(config("trainer.epochs=2"), tmp_path)
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000012"
    old_records = _records(tmp_path / "metrics.jsonl")
    assert len(old_records) > num_records

    # resume=none: the old checkpoints, metrics.jsonl, tb/ and results.json move away together
    fit(config("trainer.epochs=1", "trainer.resume=none"), tmp_path)
    aside = tmp_path / "checkpoints.replaced.1"
    assert latest_checkpoint(aside).name == "step_00000012"
    assert _records(aside / "metrics.jsonl") == old_records
    assert any(p.name.startswith("events.out.tfevents") for p in (aside / "tb").iterdir())
    assert json.loads((aside / "results.json").read_text())["train"]["steps"] == 12
    new_records = _records(tmp_path / "metrics.jsonl")
    assert len(new_records) == num_records and max(r["step"] for r in new_records) == 6  # the new run's only
    assert json.loads((tmp_path / "results.json").read_text())["train"]["steps"] == 6


def test_what_counts_as_finished():
    assert is_finished(TrainerState(epoch=3), epochs=3)
    assert not is_finished(TrainerState(epoch=3), epochs=5)  # more epochs asked for: train on
    assert is_finished(TrainerState(epoch=2, early_stopped=True), epochs=5)  # early stopping ended it
    assert not is_finished(TrainerState(epoch=2, next_batch=4), epochs=2)  # mid-epoch checkpoint


def test_retraining_sets_the_earlier_weights_bundle_and_report_aside_with_them(tmp_path, data_root, process_group):
    """Issue 43 item 3: export/, eval/ and served/ belong to the weights they were made from; a run that trains
    anew (resume=none) or further (more epochs) must not leave them beside its own weights."""
    from recsys.evaluate import EvaluateConfig, evaluate_run
    from recsys.export import ExportConfig, export_run

    config = lambda *extra: tiny_config([f"data.root={data_root}", *SHORT, *extra])  # noqa: E731

    def derive() -> dict[str, bytes]:
        export_run(ExportConfig(run_dir=str(tmp_path)))
        evaluate_run(EvaluateConfig(run_dir=str(tmp_path), ann_kinds=[], ks=[20], rankers=[]))
        return {name: (tmp_path / name / file).read_bytes() for name, file in DERIVED_FILES}

    fit(config("trainer.epochs=1"), tmp_path)
    first = derive()
    fit(config("trainer.epochs=1", "trainer.resume=none"), tmp_path)
    aside = tmp_path / "checkpoints.replaced.1"
    for name, file in DERIVED_FILES:  # with the weights they came from
        assert (aside / name / file).read_bytes() == first[name], name
    assert not (tmp_path / "export").exists() and not (tmp_path / "eval").exists()
    assert (tmp_path / "served").is_dir()  # the new run's own

    # trained further: the checkpoints stay (they are this run's), the outputs of the earlier best go aside
    second = derive()
    fit(config("trainer.epochs=2"), tmp_path)
    aside = tmp_path / "outputs.replaced.1"
    assert (aside / "export" / "manifest.json").read_bytes() == second["export"]
    assert (aside / "eval" / "report.json").read_bytes() == second["eval"]
    assert not (tmp_path / "export").exists() and not (tmp_path / "eval").exists()
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_00000012"


DERIVED_FILES = (("export", "manifest.json"), ("eval", "report.json"), ("served", "served.json"))
