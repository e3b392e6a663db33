"""Issue 53: no run read while it is written, and a user's mistake or a crafted file gets one line. Each case feeds
the issue's bad input and asserts the new outcome, and that what was there is as it was.

Entry points run in this process as ``python -m`` runs them (``runpy``, Hydra and all): a refusal is one ``error:``
line on stderr and exit status 1.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from recsys.config import EvaluateConfig, ExportConfig
from recsys.rundir.lock import RunDirLockedError, RunLock
from tests.helpers.entry_points import QUIET, files, one_error_line, run_module

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_dir_2026_12_02"


@pytest.fixture
def busy_run(tmp_path):
    """A run dir whose training is still running: its lock held by a live owner (this process)."""
    run_dir = tmp_path / "runs" / "busy"
    shutil.copytree(FIXTURE_RUN, run_dir)
    with RunLock(run_dir):
        yield run_dir


# --- 1: evaluate / export on a run that is still training ------------------------------------------------------------


@pytest.mark.parametrize(
    "module, args", [("recsys.evaluate", ["rankers=[]"]), ("recsys.export", [])], ids=["evaluate", "export"]
)
def test_evaluate_and_export_refuse_a_run_that_is_training(busy_run, module, args, monkeypatch, capsys):
    before = files(busy_run)
    assert run_module(monkeypatch, module, [f"run_dir={busy_run}", *args, *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {busy_run}: a training is running in this run dir (pid {os.getpid()} on host ")
    assert files(busy_run) == before and not (busy_run / "eval").exists()  # nothing read into a report, nothing written


def test_evaluate_run_and_export_run_refuse_it_before_reading(busy_run):
    from recsys.job.trained import evaluate_run
    from recsys.serving.export_run import export_run

    for work, ecfg in (
        (evaluate_run, EvaluateConfig(run_dir=str(busy_run))),
        (export_run, ExportConfig(run_dir=str(busy_run))),
    ):
        with pytest.raises(RunDirLockedError, match=f"pid {os.getpid()}"):
            work(ecfg)
    refit = busy_run / "refit"  # a refit dir: its run's training writes it
    refit.mkdir()
    with pytest.raises(RunDirLockedError, match=f"{busy_run}: a training is running"):
        evaluate_run(EvaluateConfig(run_dir=str(refit)))


def test_a_training_is_refused_while_the_run_is_read(tmp_path):
    from recsys.rundir.lock import reading_run_dir

    run_dir = tmp_path / "run"
    RunLock(run_dir).acquire().release()  # trained once: an empty lock file
    with (
        reading_run_dir(run_dir),
        pytest.raises(RunDirLockedError, match="recsys.evaluate or recsys.export is reading"),
    ):
        RunLock(run_dir).acquire()
    RunLock(run_dir).acquire().release()  # free again once read


# --- 3: a run_name that names runs/ itself ---------------------------------------------------------------------------


def test_a_run_name_that_is_the_runs_root_is_refused():
    from recsys.rundir.check import run_name_problem

    for name in (".", "./", ".//", "./.", "a/.", "./a"):  # the message forbids '.': any part of the name as typed
        assert run_name_problem(name, f"runs/{name}").startswith(f"run_name={name!r}: must be a plain name")
    assert run_name_problem("a/b", "runs/a/b") is None


def test_training_with_run_name_dot_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in (".", "./"):
        assert run_module(monkeypatch, "recsys.train", ["+experiment=tiny", f"run_name={name}", *QUIET]) == 1
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: run_name={name!r}: must be a plain name") and "only under runs/" in line
    assert list(tmp_path.iterdir()) == []  # no runs/.lock, .hydra/ or checkpoints/ beside the other runs


# --- 7: a dataclass's own check of a config value --------------------------------------------------------------------


def test_a_synthetic_spec_out_of_range_is_one_config_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["+experiment=tiny", "data.synthetic.num_interactions=150000", f"data.root={tmp_path / 'data'}", *QUIET]
    assert run_module(monkeypatch, "recsys.train", args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.synthetic.num_interactions=150000 must be in [2000, 60000] (num_users x ")
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())  # no dataset prepared


def test_a_config_dataclass_that_refuses_a_value_is_a_config_error():
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    from data_pipelines.config import to_typed
    from data_pipelines.errors import ConfigError

    @dataclass
    class Spec:
        n: int = 1

        def __post_init__(self) -> None:
            if self.n > 5:
                raise ValueError(f"Spec.n={self.n} must be <= 5")

    cfg = OmegaConf.structured(Spec)
    cfg.n = 9
    with pytest.raises(ConfigError, match=r"^Spec.n=9 must be <= 5$"):
        to_typed(cfg, Spec)


# --- 8: Ctrl-C during training ---------------------------------------------------------------------------------------

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]


def test_ctrl_c_checkpoints_the_step_in_one_line_and_the_rerun_resumes(tmp_path, data_root, monkeypatch, capsys):
    import json
    import signal

    import recsys.training.trainer as trainer_module

    real = trainer_module._maybe_inject_fault

    def ctrl_c(cfg, env, step):  # a user's Ctrl-C in the middle of training, after step 1
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        real(cfg, env, step)

    monkeypatch.setattr(trainer_module, "_maybe_inject_fault", ctrl_c)
    args = ["+experiment=tiny", f"data.root={data_root}", *SHORT, f"hydra.run.dir={tmp_path / 'run'}", *QUIET]
    before = signal.getsignal(signal.SIGINT)  # Python's handler; SIG_IGN where the suite runs as a background job
    try:
        code = run_module(monkeypatch, "recsys.train", args)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C: a raw KeyboardInterrupt")
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted (Ctrl-C): stopped after step 2, checkpoint " in err and "to resume from it" in err
    assert (tmp_path / "run" / "checkpoints" / "step_00000002" / "trainer_state.json").is_file()
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C does again what it did before the run
    monkeypatch.setattr(trainer_module, "_maybe_inject_fault", real)
    assert run_module(monkeypatch, "recsys.train", args) == 0  # the same command: on from step 2
    assert json.loads((tmp_path / "run" / "results.json").read_text())["train"]["steps"] == 4


def test_a_second_ctrl_c_exits_at_once(monkeypatch):
    import signal
    import time

    import recsys.rundir.preemption as preemption_module

    exits = []
    monkeypatch.setattr(preemption_module.os, "_exit", exits.append)
    with preemption_module.PreemptionHandler(30.0) as handler:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert handler.should_stop() and exits == []  # the first: finish the step, checkpoint
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
    assert exits == [preemption_module.INTERRUPTED_EXIT_CODE]  # the second: now, without a checkpoint


def test_ctrl_c_outside_the_training_loop_is_one_line(tmp_path, monkeypatch, capsys):
    import recsys.job.run as recsys_run

    def interrupted(*args, **kwargs):  # Ctrl-C while the dataset is prepared
        raise KeyboardInterrupt

    monkeypatch.setattr(recsys_run, "fit", interrupted)  # what `python -m recsys.train` imports
    monkeypatch.chdir(tmp_path)
    try:
        code = run_module(monkeypatch, "recsys.train", ["+experiment=tiny", *QUIET])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C: a raw KeyboardInterrupt")
    err = capsys.readouterr().err
    assert code == 130 and err.strip().splitlines() == [
        "interrupted (Ctrl-C); run the same command again to go on from the run's last checkpoint"
    ]


# --- 14: a CSV with two columns of one name --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["whole", "batches", "chunks"])
def test_a_csv_with_a_repeated_column_is_refused_naming_it(tmp_path, how):
    from data_pipelines.errors import DatasetError
    from data_pipelines.readers import iter_columns, read_columns
    from data_pipelines.readers.csv_chunks import iter_csv_chunks

    path = tmp_path / "log.csv"
    path.write_text("user,item,item,ts\n1,10,20,100\n2,11,21,200\n")
    read = {
        "whole": lambda: read_columns(path, ["user", "item", "ts"]),
        "batches": lambda: list(iter_columns(path, ["user", "item", "ts"])),
        "chunks": lambda: list(iter_csv_chunks(path, ["user", "item", "ts"], delimiter=",", header=True, threads=1)),
    }[how]
    with pytest.raises(DatasetError, match=rf"^{path}: column\(s\) \['item'\] appear more than once in the header"):
        read()
    assert len(read_columns(path, ["user", "ts"])) == 2  # a repeated column that is not read: harmless


# --- 15: a user id given to a bundle whose query reads no user -------------------------------------------------------


def test_a_user_id_is_refused_by_a_bundle_that_reads_no_user():
    import numpy as np
    import torch

    from recsys.data.layout import HISTORY, USER_ID
    from recsys.rankers.graph_filter.part import GraphFilterPart
    from recsys.rankers.parts import Catalogue
    from recsys.rankers.served import Served
    from recsys.rankers.two_tower.part import TwoTowerPart
    from recsys.serving.bundle import ServingBundle

    part = GraphFilterPart(torch.rand(5, 3), query_table=torch.rand(5, 3))
    catalogue = Catalogue(3, 5, np.zeros(6, dtype=np.int64), np.zeros(0, dtype=np.int64), {}, None)
    bundle = ServingBundle({"num_users": 3, "num_items": 5}, Served([part], [1.0]), catalogue)
    assert not bundle.reads_users
    message = r"the served ranker \(graph_filter\) reads no user: its query is the history alone"
    for call, name in (
        (lambda: bundle.recommend([1, 2], k=2, user_id=0), "user_id"),
        (lambda: bundle.recommend_batch([[1], [2]], 2, user_ids=[0, 1]), "user_ids"),
        (lambda: bundle.encode([0], [1], [2]), "user_ids"),
        (lambda: bundle.encode_part("graph_filter", [0], [1], [2]), "user_ids"),
    ):
        with pytest.raises(ValueError, match=rf"^{name}: {message}.* pass {name}=None"):
            call()
    assert bundle.encode(None, [1], [2]).shape == (1, 3)  # the same query without a user: served

    class Encoder:  # a two-tower query encoder's pooled inputs: (table, source)
        def __init__(self, *sources):
            self.inputs = tuple((f"t{i}", s) for i, s in enumerate(sources))

    assert not TwoTowerPart(torch.rand(5, 3), encoder=Encoder(HISTORY)).reads_users  # a profile bag alone
    assert TwoTowerPart(torch.rand(5, 3), encoder=Encoder(USER_ID, HISTORY)).reads_users
    assert Served([part, TwoTowerPart(torch.rand(5, 3), encoder=Encoder(USER_ID))], [1.0, 1.0]).reads_users


# --- 10: a bundle with a part's file deleted -------------------------------------------------------------------------


@pytest.mark.parametrize("part, name", [("two_tower", "query_encoder.pt"), ("graph_filter", "items.npy")])
def test_a_bundle_missing_a_parts_file_is_refused_naming_it(trained_run, tmp_path, part, name):
    from recsys.serving.bundle import load_bundle
    from recsys.utils.refusals import MissingPath

    bundle = tmp_path / "bundle"
    shutil.copytree(trained_run.bundle, bundle)
    missing = next(bundle.glob(f"parts/*-{part}")) / name
    missing.unlink()
    with pytest.raises(MissingPath, match=rf"^{missing}: missing; the bundle is incomplete"):
        load_bundle(bundle)


# --- 13: a file the run appends to is a symbolic link ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["train.log", "metrics.jsonl", ".lock"])
def test_a_training_refuses_to_append_through_a_link(tmp_path, data_root, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone's file\n")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / name).symlink_to(outside)
    args = ["+experiment=tiny", "run_name=r", f"data.root={data_root}", *SHORT, "hydra/hydra_logging=none"]
    assert run_module(monkeypatch, "recsys.train", [*args, "trainer.resume=none"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: runs/r/{name} is a symbolic link (to {outside}); a run writes its {name} in its own run dir, never "
        "through a link (out of the run dir, or into another run's): remove the link"
    )
    assert outside.read_text() == "someone's file\n"


def test_fit_refuses_a_lock_that_is_a_link(tmp_path, data_root, process_group):
    """What the Hydra callback cannot see (a sweep's jobs, fit() called directly): checked where it is opened. (A
    metrics.jsonl link there is moved aside with the crashed attempt's logs, or refused by the trainer on a resume.)"""
    from recsys.job.run import fit
    from recsys.rundir.links import LinkedFile
    from tests.helpers.config import tiny_config

    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(outside)
    with pytest.raises(LinkedFile, match=rf"^{run_dir / '.lock'} is a symbolic link"):
        fit(tiny_config([f"data.root={data_root}", *SHORT]), run_dir)
    assert outside.read_text() == "x" and not (run_dir / "checkpoints").exists()


def test_export_refuses_a_job_log_that_is_a_link(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run_dir)
    (run_dir / "export.log").symlink_to(tmp_path / "elsewhere.log")
    assert run_module(monkeypatch, "recsys.export", [f"run_dir={run_dir}", "hydra/hydra_logging=none"]) == 1
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {run_dir}/export.log is a symbolic link")
    assert not (tmp_path / "elsewhere.log").exists()


# --- 17: one spelling of the protocol on every dataset ---------------------------------------------------------------


def test_data_protocol_group_works_on_the_synthetic_default(tmp_path):
    from hydra import compose, initialize_config_dir

    from data_pipelines.dataset_dir import read_meta
    from data_pipelines.prepare import prepare_dataset
    from recsys.config import register_configs, to_config
    from tests.helpers.config import CONF_DIR, tiny_config

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        default = to_config(compose(config_name="config"))
        loo = to_config(compose(config_name="config", overrides=["data/protocol=loo"]))
        strong = to_config(compose(config_name="config", overrides=["data/protocol=strong_generalization"]))
    assert (default.data.protocol, default.data.min_rating, default.data.min_user_interactions) == ("recbole", 0.0, 0)
    assert loo.data.protocol == "loo" and loo.data.query_history == "recent"  # what data.protocol=loo gives
    assert (strong.data.protocol, strong.data.min_rating, strong.data.min_user_interactions) == (
        "strong_generalization",
        0.0,
        0,
    )  # fmt: skip (the generator's rows: no MovieLens filter)
    cfg = tiny_config(["data/protocol=loo", f"data.root={tmp_path}"])
    assert read_meta(prepare_dataset(cfg.data))["protocol"] == "loo"


# --- 5: a checkpoint shard (or a byte item its metadata declares) that is a crafted pickle ---------------------------


class _Shell:
    """A pickle whose load runs a shell command (what a crafted checkpoint file would hold)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _craft_shard(checkpoint: Path, marker: Path) -> Path:
    """The checkpoint's shard replaced by a pickle of the size its DCP metadata expects, whose load touches marker."""
    shard = checkpoint / "__0_0.distcp"
    payload = pickle.dumps(_Shell(f"touch {marker}"), protocol=2)  # as the issue's: one GLOBAL posix.system
    shard.write_bytes(payload + b"\0" * (shard.stat().st_size - len(payload)))
    return shard


@pytest.fixture
def run_copy(trained_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.run_dir, run_dir)
    return run_dir


def _entry_point_loading(run_dir: Path, how: str, data_root: Path) -> tuple[str, list[str], Path]:
    """The module, its arguments and the checkpoint it loads: evaluate / export (best) or a resumed training."""
    from recsys.rankers.registry import DEFAULT_FUSION
    from recsys.rundir.checkpoint import latest_checkpoint

    if how == "evaluate":
        return "recsys.evaluate", [f"run_dir={run_dir}", "rankers=[]"], run_dir / "checkpoints" / "best"
    if how == "export":
        return "recsys.export", [f"run_dir={run_dir}"], run_dir / "checkpoints" / "best"
    step = latest_checkpoint(run_dir / "checkpoints")
    args = ["+experiment=tiny", f"data.root={data_root}", f"eval.serve={DEFAULT_FUSION}", f"hydra.run.dir={run_dir}"]
    return "recsys.train", [*args, f"trainer.resume={step}"], step


@pytest.mark.parametrize("how", ["evaluate", "export", "train_resume"])
def test_a_crafted_checkpoint_shard_is_one_line_and_never_run(run_copy, data_root, tmp_path, monkeypatch, capsys, how):
    module, args, checkpoint = _entry_point_loading(run_copy, how, data_root)
    marker = tmp_path / "ran"
    shard = _craft_shard(checkpoint, marker)
    assert run_module(monkeypatch, module, [*args, *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {shard}: refused to load: not a checkpoint shard recsys wrote"), line
    assert "posix.system" in line and "nothing from it was run" in line
    assert not marker.exists()


def test_a_byte_item_a_crafted_metadata_declares_is_never_run(run_copy, tmp_path, monkeypatch, capsys):
    """DCP unpickles a value its metadata calls bytes with weights_only=False: a crafted .metadata that calls a tensor
    bytes, pointing at a pickle, ran that pickle."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    from recsys.utils.safe_load import load_dcp_metadata

    best = run_copy / "checkpoints" / "best"
    marker = tmp_path / "ran"
    metadata = load_dcp_metadata(best / ".metadata")
    key = next(iter(metadata.state_dict_metadata))
    shard = best / "__0_0.distcp"
    payload = pickle.dumps(_Shell(f"touch {marker}"), protocol=2)  # as the issue's: one GLOBAL posix.system
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload)
    metadata.state_dict_metadata[key] = BytesStorageMetadata()
    metadata.storage_data = {i: s for i, s in metadata.storage_data.items() if i.fqn != key}
    metadata.storage_data[MetadataIndex(key)] = _StorageInfo(shard.name, offset, len(payload))
    (best / ".metadata").write_bytes(pickle.dumps(metadata))
    assert run_module(monkeypatch, "recsys.export", [f"run_dir={run_copy}", *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {shard}: refused to load") and "posix.system" in line, line
    assert not marker.exists()


def test_a_refusal_of_another_rank_is_raised_on_every_rank(monkeypatch):
    """DCP gathers every rank's read error on every rank: rank 0 raises rank 1's refusal, not a CheckpointException."""
    from torch.distributed.checkpoint.api import CheckpointException

    import recsys.utils.safe_load as safe_load

    def rank_1_refused(*args, **kwargs):
        raise CheckpointException("read", {1: (safe_load.UnsafeFileError("__1_0.distcp: refused to load"), None)})

    monkeypatch.setattr(safe_load.dcp, "load", rank_1_refused)
    with pytest.raises(safe_load.UnsafeFileError, match=r"^__1_0.distcp: refused to load$"):
        safe_load.load_dcp({}, Path("ckpt"))


# --- 6: a run's config.yaml with a Python tag ------------------------------------------------------------------------


@pytest.mark.parametrize("crafted", ["checkpoints/best/config.yaml", ".hydra/config.yaml"])
@pytest.mark.parametrize("module", ["recsys.evaluate", "recsys.export"])
def test_a_config_yaml_with_a_python_tag_is_one_line(tmp_path, monkeypatch, capsys, module, crafted):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run_dir)
    if crafted == ".hydra/config.yaml":  # a run whose checkpoint holds no config of its own (older runs)
        (run_dir / "checkpoints" / "best" / "config.yaml").unlink()
    marker = tmp_path / "ran"
    (run_dir / crafted).write_text(f'model: !!python/object/apply:os.system ["touch {marker}"]\n')
    args = [f"run_dir={run_dir}", *QUIET, *(["rankers=[]"] if module == "recsys.evaluate" else [])]
    assert run_module(monkeypatch, module, args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run_dir / crafted}: not valid config YAML"), line
    assert "python/object/apply" in line and not marker.exists()


def test_a_saved_config_that_is_no_mapping_or_no_yaml_is_refused_naming_it(tmp_path):
    from recsys.rundir.saved_config import read_config_file
    from recsys.utils.refusals import RunRefused

    path = tmp_path / "config.yaml"
    for text in ("- a list\n", "model: [unclosed\n"):
        path.write_text(text)
        with pytest.raises(RunRefused, match=rf"^{path}: not valid config YAML"):
            read_config_file(path)
    path.write_text("trainer: {epochs: many}\n")  # YAML, but not the config's types
    with pytest.raises(RunRefused, match=rf"^{path}: not a config this code can read \(trainer.epochs: "):
        read_config_file(path)


# --- moved keys: an old key on the command line says where it went ---------------------------------------------------


def test_a_moved_key_on_the_command_line_says_where_it_went(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["+experiment=tiny", "model.temperature=0.05", "model.loss=ccl", *QUIET]
    assert run_module(monkeypatch, "recsys.train", args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "model.temperature moved to model.loss.temperature: write model.loss.temperature=0.05" in line, line
    assert "model.loss=ccl: the loss is a config group now: write model/loss=ccl" in line
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made a run dir


def test_moved_keys_name_their_new_place():
    from recsys.config.moved_keys import moved_keys_problem

    problem = moved_keys_problem(
        ["+model.softmax_block_mb=64", "model.sasrec.num_layers=3", "model.num_uniform_negatives=5,10", "-m"]
    )
    assert problem == (
        "config keys moved: model.softmax_block_mb moved to model.loss.block_mb: write +model.loss.block_mb=64; "
        "model.sasrec.num_layers moved to model.query_encoder.num_layers (with model/query_encoder=sasrec): write "
        "model.query_encoder.num_layers=3; model.num_uniform_negatives moved to model.negatives.num: write "
        "model.negatives.num=5,10"
    )
    assert moved_keys_problem(["model/loss=ccl", "model.loss.margin=0.8", "hydra.run.dir=x"]) is None
