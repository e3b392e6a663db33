"""A dataset without categories or timestamps (Gowalla-shaped: a given adjacency split) trains,
evaluates and exports end to end, with no category table anywhere."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_pipelines.prepare import prepare_dataset
from recsys.data.dataset import load_dataset
from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.export import ExportConfig, export_run
from recsys.job.run import fit
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config


def _write_split(folder, num_users=120, num_items=90, seed=0):
    """Users like items of their own cluster: a two-tower must beat popularity on it."""
    rng = np.random.default_rng(seed)
    clusters = 6
    train, test = [], []
    for u in range(num_users):
        own = np.arange(num_items)[np.arange(num_items) % clusters == u % clusters]
        items = rng.choice(own, 12, replace=False)
        train.append(f"{u} " + " ".join(map(str, items[:9])) + "\n")
        test.append(f"{u} " + " ".join(map(str, items[9:])) + "\n")
    (folder / "train.txt").write_text("".join(train))
    (folder / "test.txt").write_text("".join(test))


def fit_given_split(folder, overrides=()):
    """Train the tiny model on ``_write_split``'s files in ``folder``: (cfg, run dir, results), the run
    dir with the config.yaml `python -m recsys.train` would write."""
    _write_split(folder)
    cfg = tiny_config(
        [
            f"data.root={folder / 'data'}",
            "data=interactions",
            "data/protocol=given",
            f"data.interactions.train_path={folder / 'train.txt'}",
            f"data.interactions.test_path={folder / 'test.txt'}",
            "data.history_length=10",
            "trainer.epochs=4",
            "trainer.global_batch_size=128",
            *overrides,
        ]
    )
    run_dir = folder / "run"
    results = fit(cfg, run_dir)
    from omegaconf import OmegaConf

    (run_dir / ".hydra").mkdir()
    OmegaConf.save(
        OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml"
    )  # as `python -m recsys.train` writes it
    return cfg, run_dir, results


@pytest.fixture(scope="module")
def run(tmp_path_factory, process_group):
    return fit_given_split(tmp_path_factory.mktemp("adjacency"))


def test_trains_without_a_category_table(run):
    cfg, run_dir, results = run
    data = load_dataset(prepare_dataset(cfg.data))
    assert data.num_categories == 0 and set(data.table_num_rows) == {"user", "item"}
    assert results["dataset"]["counts"]["categories"] == 0
    test = results["test"]
    assert test["two_tower"]["recall@20"] > 1.5 * test["popularity"]["recall@20"]


def test_report_and_bundle_without_categories(run):
    cfg, run_dir, results = run
    report = evaluate_run(EvaluateConfig(run_dir=str(run_dir), ann_kinds=["flat"], ks=[10, 20]))
    saved = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report is not None
    # the offline report ranks exactly as training-time evaluation did (same checkpoint, same masking)
    two_tower = results["test"]["two_tower"]["recall@20"]
    assert saved["splits"]["test"]["metrics"][saved["model"]]["recall@20"] == pytest.approx(two_tower, abs=1e-6)
    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(run_dir / "bundle")))
    bundle = load_bundle(bundle_dir)
    assert bundle.manifest["num_categories"] == 0
    queries = bundle.encode(None, np.array([2, 0]), np.array([0, 6]))  # no user: a profile bag
    assert queries.shape == (2, bundle.item_embeddings.shape[1])
    two_tower = bundle.encode_part("two_tower", None, np.array([2, 0]), np.array([0, 6]))
    # the item bias (the default): a unit query, then the constant 1 that meets each item's bias
    assert torch.allclose(two_tower[:, :-1].norm(dim=1), torch.ones(2), atol=1e-5)
    assert torch.equal(two_tower[:, -1], torch.ones(2))
