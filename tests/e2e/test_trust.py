"""Issue 14: no file of a run executes code when loaded, no command deletes what it did not create,
and no run silently reports another run's weights or a wrong protocol.

Planted files carry a pickle whose ``__reduce__`` opens (creates) a marker file: a loader that
unpickles it runs that call, so "refused and no marker" means nothing from the file ran.
"""

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recsys.job.run import fit
from tests.helpers.config import tiny_config

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]


class Payload:
    """Unpickling this creates ``marker``: the stand-in for ``os.system(...)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, data_root, process_group):
    """A finished 4-step tiny run (checkpoints/best, step_00000004, results.json) and its config."""
    run_dir = tmp_path_factory.mktemp("trust") / "run"
    cfg = tiny_config([f"data.root={data_root}", *SHORT])
    fit(cfg, run_dir)
    return run_dir, cfg


def copy_run(short_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(short_run[0], run_dir)
    return run_dir


# --- 1, 3: checkpoint files -----------------------------------------------------------------------


def test_planted_rng_pt_is_refused_without_running_it(short_run, tmp_path, process_group):
    from recsys.job.trained import load_trained
    from recsys.rundir.config import load_run_config
    from recsys.utils.safe_load import UnsafeFileError

    run_dir, marker = copy_run(short_run, tmp_path), tmp_path / "pwned"
    torch.save([Payload(marker)], run_dir / "checkpoints" / "best" / "rng.pt")
    with pytest.raises(UnsafeFileError, match=r"best/rng.pt: refused to load"):
        load_trained(load_run_config(run_dir), run_dir, "", process_group)  # what evaluate / export run
    assert not marker.exists()


def test_planted_dcp_metadata_is_refused_without_running_it(short_run, tmp_path, process_group):
    """DCP itself reads .metadata with plain pickle.load: every checkpoint load goes through the allow-list."""
    from recsys.job.trained import load_trained
    from recsys.rundir.checkpoint import load_checkpoint
    from recsys.rundir.config import load_run_config
    from recsys.utils.safe_load import UnsafeFileError

    run_dir, marker = copy_run(short_run, tmp_path), tmp_path / "pwned"
    # the real checkpoint loads through the allow-list (with the optimizer state too)
    _, _, sharded, _ = load_trained(load_run_config(run_dir), run_dir, "", process_group)
    step = run_dir / "checkpoints" / "step_00000004"
    load_checkpoint(sharded, step, env=process_group, with_optimizer=False)
    (step / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(
        UnsafeFileError, match=r"step_00000004/.metadata: refused to load: it asks for (builtins|io).open"
    ):
        load_checkpoint(sharded, step, env=process_group)
    assert not marker.exists()


def test_planted_config_yaml_is_refused_without_running_it(short_run, tmp_path):
    from recsys.rundir.config import load_run_config

    run_dir, marker = copy_run(short_run, tmp_path), tmp_path / "pwned"
    (run_dir / "checkpoints" / "best" / "config.yaml").write_text(
        f"data: !!python/object/apply:builtins.open ['{marker}', 'w']\n"
    )
    with pytest.raises(Exception, match="python/object/apply"):
        load_run_config(run_dir)
    assert not marker.exists()


def test_planted_pretrained_npy_is_refused_without_running_it(tmp_path):
    from recsys.distributed.pretrained import open_pretrained

    marker, path = tmp_path / "pwned", tmp_path / "items.npy"
    np.save(path, np.array([Payload(tmp_path / "pwned")], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="not a readable .npy file"):
        open_pretrained(path, table="item", num_rows=1, dim=1)
    assert not marker.exists()


def test_planted_parquet_extension_type_is_not_unpickled(tmp_path):
    """pyarrow < 14.0.1 unpickled ``arrow.py_extension_type`` columns (CVE-2023-47248) on any read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.dataset import _read_parquet

    marker = tmp_path / "pwned"

    class Planted(pa.ExtensionType):
        def __init__(self):
            super().__init__(pa.int64(), "arrow.py_extension_type")

        def __arrow_ext_serialize__(self):
            return pickle.dumps(Payload(marker))

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    column = pa.ExtensionArray.from_storage(Planted(), pa.array([0, 1], pa.int64()))
    pq.write_table(pa.table({"item_id": column}), tmp_path / "items.parquet")
    assert _read_parquet(tmp_path / "items.parquet", ["item_id"]).column(0).to_pylist() == [0, 1]
    assert not marker.exists()


# --- 2, 4: serving bundles ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(short_run, process_group):
    from recsys.export import ExportConfig, export_run

    run_dir, _ = short_run
    return export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(run_dir.parent / "bundle")))


def test_bundle_loader_runs_no_code_from_the_bundle(bundle, tmp_path):
    from recsys.serving.bundle import load_bundle
    from recsys.utils.safe_load import UnsafeFileError

    marker = tmp_path / "pwned"
    planted = tmp_path / "bundle"
    shutil.copytree(bundle, planted)
    encoder_dir = next(planted.glob("parts/*-two_tower"))  # the two-tower's part (recsys/rankers/two_tower/part.py)
    # the torch.export archive unpickles (and falls back to weights_only=False): load_bundle never reads it
    torch.save(Payload(marker), encoder_dir / "query_encoder.pt2")
    expected = load_bundle(bundle)
    served = load_bundle(planted)
    queries = served.encode(None, np.array([2, 0]), np.array([3, 4]))  # no user: a profile bag
    torch.testing.assert_close(
        served.scores(queries), expected.scores(expected.encode(None, np.array([2, 0]), np.array([3, 4])))
    )
    assert not marker.exists()
    # the files it does read are weights-only / pickle-free
    torch.save({"user.weight": Payload(marker)}, encoder_dir / "query_encoder.pt")
    with pytest.raises(UnsafeFileError, match=r"query_encoder.pt: refused to load"):
        load_bundle(planted)
    shutil.copy(next(bundle.glob("parts/*-two_tower")) / "query_encoder.pt", encoder_dir / "query_encoder.pt")
    np.save(encoder_dir / "items.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafeFileError, match=r"items.npy: refused to load: an object array"):
        load_bundle(planted)
    assert not marker.exists()


def test_export_replaces_only_a_bundle_it_wrote(short_run, bundle, tmp_path, process_group):
    from recsys.export import ExportConfig, export_run

    run_dir = copy_run(short_run, tmp_path)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    # the run itself, an unrelated folder, a file: refused before any work, naming the path, nothing touched
    unrelated = tmp_path / "photos"
    unrelated.mkdir()
    (unrelated / "cat.jpg").write_text("meow")
    (tmp_path / "notes.txt").write_text("mine")
    for out in (run_dir, unrelated, tmp_path / "notes.txt"):
        with pytest.raises(FileExistsError, match=f"out_dir={out}: exists and"):
            export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(out)))
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert (unrelated / "cat.jpg").read_text() == "meow" and (tmp_path / "notes.txt").read_text() == "mine"
    # a bundle it wrote is replaced; one holding a file of someone's is not
    out = tmp_path / "bundle"
    shutil.copytree(bundle, out)
    (out / "item_embeddings.npy").write_bytes(b"stale")
    export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(out)))
    assert (out / "item_embeddings.npy").read_bytes() != b"stale"
    (out / "README.txt").write_text("my notes")
    with pytest.raises(FileExistsError, match=r"holds files a bundle does not \(README.txt\)"):
        export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(out)))
    assert (out / "README.txt").read_text() == "my notes"


# --- 6: one training per run dir ------------------------------------------------------------------


def test_a_second_training_in_a_locked_run_dir_fails_at_once_naming_dir_and_owner(
    tmp_path, data_root, process_group, monkeypatch
):
    import os
    import socket
    import time

    import recsys.rundir.lock as run_lock_module
    from recsys.rundir.lock import RunDirLockedError, RunLock

    run_dir = tmp_path / "run"
    cfg = tiny_config([f"data.root={data_root}", *SHORT])
    with RunLock(run_dir):  # the first training, still running (flock: conflicts even within one process)
        start = time.perf_counter()
        with pytest.raises(
            RunDirLockedError,
            match=rf"{run_dir}: another training holds this run dir \(pid {os.getpid()} "
            rf"on host {socket.gethostname()}, since .*; lock file {run_dir}/.lock\)",
        ):
            fit(cfg, run_dir)
        # at once: before the dataset, the model or any checkpoint (~1 s; the training it would start: tens of s)
        assert time.perf_counter() - start < 10
        assert not (run_dir / "checkpoints").exists()
    # a lock left by a process that died (the file names it, but nobody holds the flock) is taken over
    (run_dir / ".lock").write_text(json.dumps({"host": "gone-host", "pid": 999999, "started": "then"}))
    warnings = []
    monkeypatch.setattr(run_lock_module.log, "warning", lambda msg, *args: warnings.append(msg % args))
    fit(cfg, run_dir)
    assert any("taking over a stale lock of pid 999999 on host gone-host" in w for w in warnings), warnings
    assert (run_dir / ".lock").read_text() == ""  # released
    assert (run_dir / "results.json").is_file()


# --- 5: preparing data leaves run dirs alone ------------------------------------------------------


def test_prepare_writes_nothing_into_run_dirs(tmp_path, data_root):
    from tests.helpers.launch import launch

    run = tmp_path / "runs" / "tiny"  # a training run named like the experiment
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("the run's config\n")
    proc = launch(
        ["-m", "data_pipelines.prepare", "+experiment=tiny", f"data.root={data_root}"], cwd=tmp_path, timeout=120
    )
    assert Path(proc.stdout.strip().splitlines()[-1]).is_dir()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        Path("runs"),
        run.relative_to(tmp_path),
        Path("runs/tiny/.hydra"),
        Path("runs/tiny/.hydra/config.yaml"),
    ]
    assert (run / ".hydra" / "config.yaml").read_text() == "the run's config\n"


# --- 10: a softmax over one candidate learns nothing ----------------------------------------------


def test_batch_sizes_that_leave_one_candidate_are_refused_naming_the_key():
    with pytest.raises(
        ValueError,
        match=r"trainer.global_batch_size=1: in-batch softmax needs >= 2 candidates per step, "
        r"this leaves 1 \(with model.negatives.num=0\)",
    ):
        tiny_config(["trainer.global_batch_size=1"])
    assert tiny_config(["trainer.global_batch_size=1", "model.negatives.num=1"]).trainer.global_batch_size == 1
    assert tiny_config(["trainer.global_batch_size=2"]).trainer.global_batch_size == 2


# --- 7: another batch size mid-epoch ---------------------------------------------------------------


def test_resuming_mid_epoch_with_another_batch_size_is_refused_naming_both(
    short_run, tmp_path, data_root, process_group
):
    run_dir = copy_run(short_run, tmp_path)
    step = run_dir / "checkpoints" / "step_00000004"
    state = json.loads((step / "trainer_state.json").read_text())
    assert state["global_batch_size"] == 256 and state["next_batch"] == 0  # saved at the end of epoch 0
    # at an epoch end the size may change
    fit(tiny_config([f"data.root={data_root}", *SHORT, "trainer.epochs=2", "trainer.global_batch_size=128"]), run_dir)
    # mid-epoch it may not: the checkpoint's batch 2 of 256 is not batch 2 of 128
    (step / "trainer_state.json").write_text(json.dumps({**state, "epoch": 0, "next_batch": 2}))
    with pytest.raises(
        ValueError,
        match=r"trainer.global_batch_size=128: .*step_00000004 was saved mid-epoch \(epoch 0, batch 2\) "
        r"with trainer.global_batch_size=256; .* Resume with trainer.global_batch_size=256",
    ):
        fit(
            tiny_config([f"data.root={data_root}", *SHORT, "trainer.global_batch_size=128", f"trainer.resume={step}"]),
            run_dir,
        )


# --- 16: a killed worker on one of two hosts: tests/rundir/test_fault_tolerance.py (two torchrun agents) ---

# --- 17: SIGTERM ----------------------------------------------------------------------------------


def sigterm_at_step(monkeypatch, at: int) -> None:
    """Kubernetes / Slurm stand-in: SIGTERM to this process in the middle of training (after step ``at``)."""
    import os
    import signal

    import recsys.training.trainer as trainer_module

    real = trainer_module._maybe_inject_fault

    def fault(cfg, env, step):
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)
        real(cfg, env, step)

    monkeypatch.setattr(trainer_module, "_maybe_inject_fault", fault)


def test_sigterm_checkpoints_the_finished_step_and_the_rerun_loses_none(
    tmp_path, data_root, process_group, monkeypatch
):
    from recsys.rundir.checkpoint import read_trainer_state
    from recsys.rundir.preemption import Preempted

    cfg = tiny_config([f"data.root={data_root}", *SHORT, "trainer.max_steps_per_epoch=6"])
    sigterm_at_step(monkeypatch, 3)
    with pytest.raises(Preempted, match=r"stopped after step 4, checkpoint .*step_00000004") as stopped:
        fit(cfg, tmp_path)  # the signal lands after step 3's check: step 4 finishes, then the checkpoint
    state = read_trainer_state(Path(stopped.value.checkpoint))
    assert (state.step, state.epoch, state.next_batch, state.samples) == (4, 0, 4, 4 * 256)
    assert not (tmp_path / "results.json").exists()
    monkeypatch.undo()
    results = fit(cfg, tmp_path)  # resume=auto: batches 4 and 5, each example once
    assert results["train"]["steps"] == 6 and results["train"]["samples"] == 6 * 256


def test_sigterm_exits_train_with_the_preempted_status(tmp_path, data_root, monkeypatch):
    """`python -m recsys.train` (Hydra and all, in this process) exits 75: not success, not a failure."""
    import runpy
    import sys

    from recsys.rundir.preemption import PREEMPTED_EXIT_CODE

    sigterm_at_step(monkeypatch, 1)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "recsys.train",
            "+experiment=tiny",
            f"data.root={data_root}",
            *SHORT,
            f"hydra.run.dir={tmp_path / 'run'}",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ],
    )
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("recsys.train", run_name="__main__", alter_sys=True)  # as `python -m recsys.train`
    assert exited.value.code == PREEMPTED_EXIT_CODE == 75
    assert (tmp_path / "run" / "checkpoints" / "step_00000002" / "trainer_state.json").is_file()


def test_no_checkpoint_within_the_grace_period_exits_preempted_anyway(monkeypatch):
    import os
    import signal
    import time

    import recsys.rundir.preemption as preemption_module

    exits = []
    monkeypatch.setattr(preemption_module.os, "_exit", exits.append)
    with preemption_module.PreemptionHandler(0.2) as handler:
        os.kill(os.getpid(), signal.SIGTERM)  # the loop never gets to checkpoint (a step that hangs)
        time.sleep(0.1)
        assert handler.should_stop() and exits == []
        time.sleep(0.4)
    assert exits == [preemption_module.PREEMPTED_EXIT_CODE]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
    # a main thread blocked in a collective (its peer died) never runs Python's handler: the watchdog starts anyway
    exits.clear()
    handler = preemption_module.PreemptionHandler(0.2)
    with handler:
        signal.signal(signal.SIGTERM, lambda *_: None)  # stands in for the handler that never gets to run
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.6)
    assert handler.requested and exits == [preemption_module.PREEMPTED_EXIT_CODE]


# --- 9: a config that is not the weights' --------------------------------------------------------


def test_evaluate_refuses_a_run_config_the_weights_were_not_trained_with(short_run, tmp_path):
    from recsys.rundir.config import load_run_config

    run_dir, cfg = copy_run(short_run, tmp_path), short_run[1]
    (run_dir / "checkpoints" / "best" / "config.yaml").unlink()  # a checkpoint from before it carried its config
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    assert load_run_config(run_dir).data.split_seed == 0  # the run's own config: fine
    changed = OmegaConf.structured(cfg)
    changed.data.split_seed = 1  # another split: other test users, inflated recall
    OmegaConf.save(changed, run_dir / ".hydra" / "config.yaml")
    with pytest.raises(
        ValueError,
        match=r"\.hydra/config.yaml: another data/model config \(fingerprint \w+\) than the weights "
        r"in .*checkpoints/best were trained with",
    ):
        load_run_config(run_dir)


# --- 8: best/ deleted ------------------------------------------------------------------------------


def test_a_deleted_best_checkpoint_is_replaced_by_the_same_weights_or_named(
    short_run, tmp_path, data_root, process_group
):
    run_dir = copy_run(short_run, tmp_path)
    expected = json.loads((run_dir / "results.json").read_text())
    assert expected["checkpoint"] == str(short_run[0] / "checkpoints" / "best")
    shutil.rmtree(run_dir / "checkpoints" / "best")
    (
        run_dir / "results.json"
    ).unlink()  # the final test evaluation runs again (a finished run with results only prints them)
    cfg = tiny_config([f"data.root={data_root}", *SHORT])
    results = fit(cfg, run_dir)  # the finished run again: step_00000004 ended the best epoch (0)
    assert results["checkpoint"] == str(run_dir / "checkpoints" / "step_00000004")
    assert results["train"]["best_epoch"] == 0 and results["test"] == expected["test"]
    # as if epoch 1 had been worse and keep_last_checkpoints=1 had dropped the end of epoch 0: those weights are gone
    last = run_dir / "checkpoints" / "step_00000009"
    (run_dir / "checkpoints" / "step_00000004").rename(last)
    state = json.loads((last / "trainer_state.json").read_text())
    (last / "trainer_state.json").write_text(
        json.dumps({**state, "step": 9, "epoch": 2, "best_epoch": 0, "bad_epochs": 1})
    )
    with pytest.raises(
        FileNotFoundError,
        match=r"checkpoints/best: missing or damaged, and no step checkpoint from the end of "
        r"the best epoch \(0\) is left",
    ):
        fit(tiny_config([f"data.root={data_root}", *SHORT, "trainer.epochs=2"]), run_dir)


# --- 11, 13: meta.json against its files ---------------------------------------------------------


@pytest.fixture
def dataset_copy(tiny_data, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(tiny_data.dir, root)
    return root


def edit_meta(root: Path, **changes) -> None:
    meta = json.loads((root / "meta.json").read_text())
    (root / "meta.json").write_text(json.dumps({**meta, **changes}))


def test_every_count_in_meta_json_is_checked_against_its_file(dataset_copy):
    from recsys.data.dataset import load_dataset

    load_dataset(dataset_copy)
    edit_meta(dataset_copy, num_users=401)  # one user table row more than users.parquet: silently the wrong size
    with pytest.raises(
        ValueError,
        match=rf"{dataset_copy}/meta.json: 'num_users' is 401, but {dataset_copy}/users.parquet has 400 rows",
    ):
        load_dataset(dataset_copy)
    edit_meta(dataset_copy, num_users=400, counts={"train": 15944, "valid": 2028, "test": 9999})
    with pytest.raises(ValueError, match=r"'counts.test' is 9999, but .*/test.parquet has 2028 rows"):
        load_dataset(dataset_copy)


def test_an_empty_train_split_is_named_as_such(dataset_copy):
    import pyarrow.parquet as pq

    from recsys.data.dataset import load_dataset

    train = dataset_copy / "train.parquet"
    pq.write_table(pq.read_table(train).slice(0, 0), train)
    edit_meta(dataset_copy, counts={"train": 0, "valid": 2028, "test": 2028})
    with pytest.raises(ValueError, match=rf"{train}: the train split is empty \(0 rows\)"):
        load_dataset(dataset_copy)


# --- 14: best/ is not a resume point --------------------------------------------------------------


def test_resuming_from_best_says_it_holds_weights_only_and_init_from_starts_from_it(
    short_run, tmp_path, data_root, process_group
):
    best = short_run[0] / "checkpoints" / "best"
    cfg = [f"data.root={data_root}", *SHORT, "trainer.max_steps_per_epoch=2"]
    with pytest.raises(
        ValueError,
        match=rf"trainer.resume='{best}': {best} holds weights only .* start a new run from these "
        rf"weights: trainer.init_from={best} trainer.resume=none",
    ):
        fit(tiny_config([*cfg, f"trainer.resume={best}"]), tmp_path / "a")
    results = fit(tiny_config([*cfg, f"trainer.init_from={best}"]), tmp_path / "b")
    assert results["train"]["steps"] == 2  # a new run: step 0, fresh optimizer
    with pytest.raises(ValueError, match=r"trainer.init_from=.*: weights of another data/model config"):
        fit(tiny_config([*cfg, f"trainer.init_from={best}", "model.tower_dims=[24,16]"]), tmp_path / "c")


# --- 15: messages and files after failures --------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_names_the_path(short_run, tmp_path, process_group, monkeypatch):
    import errno

    import torch.distributed.checkpoint.filesystem as dcp_filesystem

    from recsys.job.trained import load_trained
    from recsys.rundir.checkpoint import TrainerState, latest_checkpoint, save_checkpoint
    from recsys.rundir.config import load_run_config

    run_dir = copy_run(short_run, tmp_path)
    _, _, sharded, _ = load_trained(load_run_config(run_dir), run_dir, "", process_group)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp_filesystem, "_write_item", full_disk)
    root = run_dir / "checkpoints"
    with pytest.raises(
        OSError, match=rf"{root}/step_00000009.tmp: writing the checkpoint failed \(.*No space left on device"
    ) as e:
        save_checkpoint(sharded, TrainerState(step=9), root=root, env=process_group)
    assert e.value.errno == errno.ENOSPC
    assert latest_checkpoint(root).name == "step_00000004"


def test_metrics_log_holds_each_step_once_after_a_crash_and_resume(tmp_path, data_root, process_group, monkeypatch):
    import recsys.training.trainer as trainer_module

    def crash(cfg, env, step):
        if step == 3:
            raise RuntimeError("killed")

    cfg = tiny_config(
        [f"data.root={data_root}", *SHORT, "trainer.log_every_steps=1", "trainer.checkpoint_every_steps=2"]
    )
    monkeypatch.setattr(trainer_module, "_maybe_inject_fault", crash)
    with pytest.raises(RuntimeError, match="killed"):
        fit(cfg, tmp_path)  # logged step 3, checkpointed step 2
    monkeypatch.undo()
    fit(cfg, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]


def test_results_json_is_as_readable_as_the_other_outputs(short_run):
    import stat

    mode = lambda name: stat.S_IMODE((short_run[0] / name).stat().st_mode)  # noqa: E731
    assert mode("results.json") == mode("metrics.jsonl") and mode("results.json") & 0o044 == 0o044


def test_evaluate_and_export_of_a_missing_run_dir_create_nothing(tmp_path, monkeypatch, capsys):
    import runpy
    import sys

    missing = tmp_path / "runs" / "typo"
    for module in ("recsys.evaluate", "recsys.export"):
        monkeypatch.setattr(
            sys, "argv", [module, f"run_dir={missing}", "hydra/job_logging=none", "hydra/hydra_logging=none"]
        )
        with pytest.raises(SystemExit) as exited:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        assert exited.value.code == 1
        assert f"run_dir={missing}: no such run dir" in capsys.readouterr().err
        assert not (tmp_path / "runs").exists()


# --- 12: a damaged dataset dir is rebuilt ---------------------------------------------------------


def test_prepare_rebuilds_a_truncated_file_instead_of_keeping_it(tmp_path):
    from data_pipelines.prepare import prepare_dataset
    from recsys.data.dataset import load_dataset

    cfg = tiny_config([f"data.root={tmp_path}"]).data
    root = prepare_dataset(cfg)
    train = root / "train.parquet"
    good = train.read_bytes()
    assert json.loads((root / "meta.json").read_text())["files"]["train.parquet"] == len(good)
    train.write_bytes(good[: len(good) // 2])  # a copy cut short
    with pytest.raises(ValueError, match=rf"{train}: not a readable parquet file .*prepare the dataset again"):
        load_dataset(root)
    assert prepare_dataset(cfg) == root  # the cache check sees the damage: prepared again, not kept
    assert train.read_bytes() == good
    assert len(load_dataset(root).splits["train"]) == 15944
