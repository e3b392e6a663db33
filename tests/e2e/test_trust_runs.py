"""Issue 28, the run half: no run written outside its root, no raw traceback for a user's mistake,
logs and messages that tell the truth. Each case of the issue feeds its exact bad input and asserts
the new outcome, and that what was already trained or written is as it was.

Entry points run in this process as ``python -m`` runs them (``runpy``, Hydra and all): a refusal
is one ``error:`` line on stderr and exit status 1, its traceback in train.log only.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from recsys.job.run import fit
from tests.helpers.config import tiny_config
from tests.helpers.entry_points import QUIET, files, one_error_line, run_module

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, data_root, process_group):
    """A finished 4-step tiny run, its config saved as `python -m recsys.train` saves it."""
    from omegaconf import OmegaConf

    run_dir = tmp_path_factory.mktemp("runs") / "run"
    cfg = tiny_config([f"data.root={data_root}", *SHORT])
    fit(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    return run_dir, cfg


def copy_run(short_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(short_run[0], run_dir)
    return run_dir


# --- 6, 11: run_name outside runs/, or a link to another run --------------------------------------


def test_a_run_name_that_leaves_runs_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)  # runs/../../elsewhere is tmp_path/a/elsewhere
    for name in ("../../elsewhere", str(tmp_path / "abs"), "x/../../y"):
        assert run_module(monkeypatch, "recsys.train", ["+experiment=tiny", f"run_name={name}", *QUIET]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: run_name={name!r}: must be a plain name") and "only under runs/" in line
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "a", work]  # nothing, anywhere


def test_a_run_name_that_is_a_link_to_another_run_is_refused_and_that_run_untouched(
    tmp_path, short_run, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    other = copy_run(short_run, tmp_path / "runs")  # runs/run: someone's finished run
    before = files(other)
    (tmp_path / "runs" / "mine").symlink_to("run")
    for args in (
        ["+experiment=tiny", "run_name=mine"],
        ["-m", "+experiment=tiny", "run_name=mine", "trainer.epochs=1,2"],
    ):
        assert run_module(monkeypatch, "recsys.train", [*args, *QUIET]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: run_name=mine: runs/mine is a symbolic link (to run)")
    assert files(other) == before  # its .hydra/ too: no results printed again, nothing rewritten


# --- 7: data.root a file ---------------------------------------------------------------------------


def test_data_root_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "root").write_text("a file")
    code = run_module(
        monkeypatch,
        "recsys.train",
        ["+experiment=tiny", f"data.root={tmp_path / 'root'}", f"hydra.run.dir={tmp_path / 'run'}", *QUIET],
    )
    assert code == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"error: data.root={tmp_path / 'root'}: is a file, not a folder; data.root is the folder prepared dataset "
        "dirs are written in (RECSYS_DATA_ROOT, default data/): give a folder"
    )


# --- 8: a crash before the first checkpoint, then the same command ---------------------------------


def crash_at(monkeypatch, at: int) -> None:
    import recsys.training.trainer as trainer_module

    def fault(cfg, env, step):
        if step == at:
            raise RuntimeError("killed")

    monkeypatch.setattr(trainer_module, "_maybe_inject_fault", fault)


def tb_steps(tb: Path, tag: str = "train/loss") -> list[int]:
    """The steps TensorBoard shows for ``tag`` (every event file of the folder, purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb))
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_a_rerun_after_a_crash_logs_each_step_once(tmp_path, data_root, process_group, monkeypatch):
    for label, every in (("before the first checkpoint", 0), ("after one", 2)):
        run_dir = tmp_path / str(every)
        cfg = tiny_config(
            [f"data.root={data_root}", *SHORT, "trainer.log_every_steps=1", f"trainer.checkpoint_every_steps={every}"]
        )
        crash_at(monkeypatch, 3)
        with pytest.raises(RuntimeError, match="killed"):
            fit(cfg, run_dir)  # logged steps 1-3; checkpointed step 2 (every=2) or nothing
        monkeypatch.undo()
        fit(cfg, run_dir)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4], label
        assert tb_steps(run_dir / "tb") == [1, 2, 3, 4], label
        if every == 0:  # the crashed attempt's logs are kept aside, not deleted
            kept = run_dir / "logs.replaced.1"
            assert [json.loads(x)["step"] for x in (kept / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
            assert tb_steps(kept / "tb") == [1, 2, 3]


# --- 9: a given split's dropped rows ---------------------------------------------------------------


def test_a_given_splits_dropped_rows_are_on_the_console_in_train_log_and_results(tmp_path, process_group, caplog):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    train = [(u, int(i)) for u in range(60) for i in rng.choice(80, 12, replace=False)]
    test = [(u, (u * 7) % 80) for u in range(60)] + [(1000 + u, 1) for u in range(5)] + [(0, 999)]
    test += [train[0], train[1]]  # pairs already in train
    pd.DataFrame(train, columns=["u", "i"]).to_csv(tmp_path / "train.csv", index=False)
    pd.DataFrame(test, columns=["u", "i"]).to_csv(tmp_path / "test.csv", index=False)
    cfg = tiny_config(
        [
            f"data.root={tmp_path / 'data'}",
            "data=interactions",
            "data/protocol=given",
            f"data.interactions.train_path={tmp_path / 'train.csv'}",
            f"data.interactions.test_path={tmp_path / 'test.csv'}",
            "data.interactions.user_column=u",
            "data.interactions.item_column=i",
            *SHORT,
        ]
    )
    with caplog.at_level(logging.INFO, logger="recsys.job.checks"):
        results = fit(cfg, tmp_path / "run")
    dropped = results["dataset"]["given_split"]["dropped"]["test"]
    in_train = dropped["pair_in_train"]
    assert dropped["user_not_in_train"] == 5 and dropped["item_not_in_train"] == 1 and in_train >= 2
    said = [r.getMessage() for r in caplog.records if r.name == "recsys.job.checks"]
    assert any(
        m.startswith(f"given split: {6 + in_train} of {len(test)} test rows dropped (5 a user with no train rows, ")
        for m in said
    ), said
    assert json.loads((tmp_path / "run" / "results.json").read_text())["dataset"]["given_split"]["dropped"]["test"] == (
        dropped
    )


# --- 12: export to a folder it cannot write --------------------------------------------------------


def test_export_to_a_read_only_place_is_refused_before_any_work(trained_run, monkeypatch, capsys):
    import recsys.job.trained as run_module_
    from recsys.utils.refusals import RunRefused

    def no_work(*args, **kwargs):
        raise AssertionError("loaded the run before checking out_dir")

    monkeypatch.setattr(run_module_, "load_run_config", no_work)
    out = Path("/proc/recsys-bundle")  # a file system nobody writes in, whoever runs the tests
    from recsys.export import ExportConfig, export_run

    with pytest.raises(RunRefused, match=r"out_dir=/proc/recsys-bundle: cannot write in /proc \("):
        export_run(ExportConfig(run_dir=str(trained_run.run_dir), out_dir=str(out)))
    code = run_module(monkeypatch, "recsys.export", [f"run_dir={trained_run.run_dir}", f"out_dir={out}", *QUIET])
    assert code == 1
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: out_dir=/proc/recsys-bundle: cannot write in /proc"
    )


# --- 13: a sweep with one invalid job -------------------------------------------------------------


def test_a_sweep_stops_at_an_invalid_job_and_prints_its_summary(tmp_path, data_root, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["-m", "+experiment=tiny", "run_name=sweep", f"data.root={data_root}", *SHORT, *QUIET]
    code = run_module(monkeypatch, "recsys.train", [*args, "trainer.global_batch_size=256,1,128"])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: bad config values: trainer.global_batch_size=1: in-batch softmax needs >= 2" in err
    assert "sweep of 2 jobs" in err and "| 1 | trainer.global_batch_size=1 |" in err  # the summary, printed
    assert "the sweep stopped at this job; the jobs after it did not run" in err
    sweep = tmp_path / "runs" / "sweep"
    assert (sweep / "0" / "results.json").is_file() and not (sweep / "2").exists()
    jobs = json.loads((sweep / "sweep.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["done", "no results.json (failed, or still running)"]


# --- 15: cut-offs beyond the catalogue ------------------------------------------------------------


def test_evaluating_recall_beyond_the_catalogue_is_warned(trained_run, tmp_path, caplog):
    from recsys.evaluate import EvaluateConfig, evaluate_run

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.run_dir, run_dir)
    with caplog.at_level(logging.WARNING, logger="recsys.job.checks"):
        evaluate_run(EvaluateConfig(run_dir=str(run_dir), ks=[5, 300], ann_kinds=[], rankers=[]))
    said = [r.getMessage() for r in caplog.records if r.name == "recsys.job.checks"]
    assert said == [
        "ks=[5, 300]: k=300 is not below the catalogue's 300 items: the top k holds every item, so Recall@k is 1 "
        "(and NDCG@k near it) by construction, whatever the model; choose cut-offs below 300"
    ]


# --- 18: a full disk at the first checkpoint -----------------------------------------------------------


def test_a_full_disk_at_the_first_checkpoint_says_there_is_none_to_resume(
    trained_run, tmp_path, process_group, monkeypatch
):
    import errno

    import torch.distributed.checkpoint.filesystem as dcp_filesystem

    from recsys.job.trained import load_trained
    from recsys.rundir.checkpoint import TrainerState, save_checkpoint
    from recsys.rundir.config import load_run_config

    _, _, sharded, _ = load_trained(load_run_config(trained_run.run_dir), trained_run.run_dir, "", process_group)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp_filesystem, "_write_item", full_disk)
    root = tmp_path / "checkpoints"
    with pytest.raises(OSError, match=r"No space left on device\); no earlier checkpoint exists, so a rerun starts "):
        save_checkpoint(sharded, TrainerState(step=2), root=root, env=process_group)


# --- 19: run-side refusals: one line, the traceback in train.log --------------------------------------


def test_run_side_refusals_are_one_line_with_the_traceback_in_train_log(
    short_run, tmp_path, data_root, monkeypatch, capsys, root_logging
):
    import recsys.rundir.check as run_dir_check
    from recsys.rundir.lock import RunLock

    run_dir = copy_run(short_run, tmp_path)
    base = ["+experiment=tiny", f"data.root={data_root}", *SHORT, f"hydra.run.dir={run_dir}"]
    hydra_before = files(run_dir / ".hydra")
    # the lock held by another training: refused before Hydra rewrites the run's .hydra/
    with RunLock(run_dir):
        assert run_module(monkeypatch, "recsys.train", [*base, *QUIET]) == 1
        assert "another training holds this run dir" in one_error_line(capsys.readouterr().err)
        assert files(run_dir / ".hydra") == hydra_before
        # ... and by fit's own lock, had it been taken between the two (one line too)
        monkeypatch.setattr(run_dir_check, "held_elsewhere", lambda run_dir: None)
        assert run_module(monkeypatch, "recsys.train", [*base, *QUIET]) == 1
        assert "another training holds this run dir" in one_error_line(capsys.readouterr().err)
        assert files(run_dir / ".hydra") == hydra_before  # the run writes its record only once it trains
    # bad config values; weights of another model config; with Hydra's job logging: train.log has the traceback
    for args, said in (
        (["trainer.global_batch_size=1"], "error: bad config values: trainer.global_batch_size=1"),
        (["model.tower_dims=[24,16]"], "error: {}/checkpoints/step_00000004: saved for another data/model config"),
        (
            ["trainer.resume={}/checkpoints/best"],
            "error: trainer.resume='{}/checkpoints/best': {}/checkpoints/best holds",
        ),
    ):
        log = run_dir / "train.log"
        log.unlink(missing_ok=True)
        code = run_module(monkeypatch, "recsys.train", [*base, *(a.format(run_dir) for a in args)])
        assert code == 1
        assert one_error_line(capsys.readouterr().err).startswith(said.format(run_dir, run_dir, run_dir))
        assert "Traceback (most recent call last)" in log.read_text() and "refused: " in log.read_text()
    # evaluate of a run whose config was edited: one line
    edited = (run_dir / ".hydra" / "config.yaml").read_text().replace("split_seed: 0", "split_seed: 1")
    (run_dir / "checkpoints" / "best" / "config.yaml").unlink()
    (run_dir / ".hydra" / "config.yaml").write_text(edited)
    assert run_module(monkeypatch, "recsys.evaluate", [f"run_dir={run_dir}", *QUIET]) == 1
    assert "another data/model config (fingerprint" in one_error_line(capsys.readouterr().err)


def test_a_graph_filter_too_big_for_the_host_is_refused_before_training(
    tmp_path, data_root, process_group, monkeypatch
):
    import recsys.job.run_stage as run
    from data_pipelines.errors import ConfigError

    cfg = tiny_config([f"data.root={data_root}", *SHORT, "eval.rankers=[two_tower,two_tower+graph_filter]"])
    monkeypatch.setattr(run, "available_memory_bytes", lambda device: 2**20)  # 1 MiB free
    with pytest.raises(ConfigError) as e:
        fit(cfg, tmp_path / "run")
    said = str(e.value)
    assert said.startswith("eval.settings.graph_filter.rank=2048: the graph filter's fit after training over ")
    assert "more than the 0.0 GiB available: lower eval.settings.graph_filter.rank" in said
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the first step
    # without the graph filter the same host trains
    cfg = tiny_config([f"data.root={data_root}", *SHORT, "eval.rankers=[two_tower,popularity]"])
    assert fit(cfg, tmp_path / "run2")["headline"]["ranker"] == "two_tower"
