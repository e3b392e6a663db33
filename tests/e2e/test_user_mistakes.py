"""A user's mistake is one line, found before any work (issue 43 items 6-9): each case runs the entry point as
``python -m`` runs it and asserts one ``error:`` line naming the file, key or value, and no traceback; a bundle's
damaged file is one exception naming it."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

import recsys.job.trained
from recsys.export import ExportConfig, export_run
from recsys.job.run import fit
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.entry_points import QUIET, one_error_line, run_module

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory, process_group) -> Path:
    """A finished 4-step tiny run on a log of text ids (its dataset dir has vocab/), with its bundle (export/);
    read-only: copy it to change anything."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    log = pd.DataFrame(
        [(f"u{u}", f"i{i}") for u in range(200) for i in rng.choice(100, size=15, replace=False)],
        columns=["user_id", "item_id"],
    )
    log.to_csv(root / "log.csv", index=False)
    overrides = ["data=interactions", f"data.interactions.path={root / 'log.csv'}", f"data.root={root / 'data'}"]
    fit(tiny_config([*overrides, *SHORT, "trainer.global_batch_size=128"]), root / "run")
    export_run(ExportConfig(run_dir=str(root / "run")))
    return root / "run"


@pytest.fixture
def run_copy(exported_run, tmp_path) -> Path:
    shutil.copytree(exported_run, tmp_path / "run")
    return tmp_path / "run"


def no_loading(monkeypatch) -> None:
    """Loading a run's weights fails the test: a name must be refused before any work."""

    def refused_too_late(*args, **kwargs):
        raise AssertionError("the run was loaded before its settings were checked")

    monkeypatch.setattr(recsys.job.trained, "load_trained", refused_too_late)


# --- 6: a batch larger than the training examples -------------------------------------------------------------


def test_a_batch_larger_than_the_training_examples_is_one_line_before_training(tmp_path, monkeypatch, capsys):
    pd.DataFrame({"user_id": [7] * 13, "item_id": range(13), "timestamp": range(13)}).to_csv(
        tmp_path / "one_user.csv", index=False
    )
    args = [
        "+experiment=tiny",
        "data=interactions",
        f"data.interactions.path={tmp_path / 'one_user.csv'}",
        f"data.root={tmp_path / 'data'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        *QUIET,
    ]
    assert run_module(monkeypatch, "recsys.train", args) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: trainer.global_batch_size=256: more than the ") and "training examples" in line
    assert "trainer.global_batch_size=" in line.split("lower")[1]  # what to set instead
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the model was built


# --- 7: no run_dir ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["recsys.export", "recsys.evaluate"])
def test_no_run_dir_is_one_line(module, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_module(monkeypatch, module, QUIET) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: run_dir: required") and f"python -m {module} run_dir=runs/" in line
    assert list(tmp_path.iterdir()) == []  # nothing created


# --- 8: names checked before any work ---------------------------------------------------------------------------


def test_an_unknown_index_kind_is_refused_before_loading(run_copy, monkeypatch, capsys):
    no_loading(monkeypatch)
    manifest = (run_copy / "export" / "manifest.json").read_bytes()
    assert run_module(monkeypatch, "recsys.export", [f"run_dir={run_copy}", "index=annoy", *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line == "error: index=annoy: choose one of flat, ivf_flat, hnsw (the FAISS index written with the bundle)"
    assert (run_copy / "export" / "manifest.json").read_bytes() == manifest


def test_a_ranker_of_a_plugin_not_loaded_is_refused_before_loading(run_copy, monkeypatch, capsys):
    config = run_copy / "checkpoints" / "best" / "config.yaml"
    cfg = OmegaConf.load(config)
    cfg.eval.rankers = ["two_tower", "popularity", "recent_popularity"]  # registered by a plugin at training time
    OmegaConf.save(cfg, config)
    no_loading(monkeypatch)
    assert run_module(monkeypatch, "recsys.evaluate", [f"run_dir={run_copy}", *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: eval.rankers: unknown ranker 'recent_popularity'")
    for bad, said in (("ann_kinds=[annoy]", "ann_kinds=['annoy']"), ("splits=[train]", "splits=['train']")):
        assert run_module(monkeypatch, "recsys.evaluate", [f"run_dir={run_copy}", bad, *QUIET]) == 1
        assert one_error_line(capsys.readouterr().err).startswith(f"error: {said}")


# --- 9: damaged files: one line naming the file ----------------------------------------------------------------


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_crafted_checkpoint_is_one_line_naming_its_file(run_copy, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "pwned"
    (run_copy / "checkpoints" / "best" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    assert run_module(monkeypatch, "recsys.evaluate", [f"run_dir={run_copy}", *QUIET]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run_copy}/checkpoints/best/.metadata: refused to load")
    assert not marker.exists()


def test_a_damaged_bundle_is_one_error_naming_the_file(exported_run, tmp_path):
    def damaged(pattern: str, cut: int) -> tuple[Path, Path]:
        bundle = tmp_path / pattern.replace("/", "_").replace("*", "")
        shutil.copytree(exported_run / "export", bundle)
        path = next(bundle.glob(pattern))
        path.write_bytes(path.read_bytes()[:cut])  # written in part
        return bundle, path

    bundle, encoder = damaged("parts/*-two_tower/query_encoder.pt", 2000)  # the two-tower's part
    with pytest.raises(ValueError, match=rf"^{encoder}: cannot be read") as e:
        load_bundle(bundle)
    assert "\n" not in str(e.value)
    bundle, manifest = damaged("manifest.json", 100)
    with pytest.raises(ValueError, match=rf"^{manifest}: not a readable JSON manifest") as e:
        load_bundle(bundle)
    assert "\n" not in str(e.value)


def test_a_bundle_missing_a_file_is_refused_naming_it(exported_run, tmp_path):
    for name in ("vocab", "items.parquet", "index.faiss"):
        bundle = tmp_path / name / "bundle"
        shutil.copytree(exported_run / "export", bundle)
        shutil.rmtree(bundle / name) if name == "vocab" else (bundle / name).unlink()
        with pytest.raises(ValueError, match=rf"^{bundle / name}: missing; the bundle is incomplete"):
            load_bundle(bundle)
