"""Serving bundle round trip: a plain process without torchrec reproduces the trained model's scores."""

import json

import numpy as np
import torch

from recsys.config import query_layout
from recsys.data.batches import FeatureBuilder, latest_items
from recsys.evaluation.sharded import Evaluator, embed
from recsys.run import load_trained
from tests.helpers.launch import launch

SERVE = """
import sys, numpy as np
from recsys.serving import load_bundle
bundle = load_bundle(sys.argv[1])
inputs = np.load(sys.argv[2])
queries = bundle.encode(inputs["users"], inputs["lengths"], inputs["items"])
np.save(sys.argv[3], bundle.scores(queries).numpy())
assert not any(m.startswith("torchrec") or m.startswith("fbgemm") for m in sys.modules), "serving imported torchrec"
"""


def test_exported_bundle_reproduces_training_time_scores(tmp_path, trained_run, process_group):
    cfg, run_dir, bundle = (
        trained_run.cfg,
        trained_run.run_dir,
        trained_run.bundle,
    )  # export_run(ExportConfig(run_dir=...))

    # training-time embeddings of the test users and of every item, from the sharded model
    data, sharded, _ = load_trained(cfg, run_dir, "", process_group)
    two_tower = sharded.module.module.model.eval()
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, _, _, timeline = Evaluator(data, builder, ks=[20], batch_size=64, chunk_size=64).protocol("test")
    common = dict(batch_size=64, device=torch.device("cpu"))
    expected = (
        embed(two_tower, builder, side="query", ids=users, timeline=timeline, **common)
        @ embed(two_tower, builder, side="candidate", ids=np.arange(data.num_items), timeline=None, **common).t()
    )

    lengths, items = latest_items(timeline, users, data.num_users, cfg.data.history_length)
    np.savez(tmp_path / "inputs.npz", users=users, lengths=lengths, items=items)
    launch(["-c", SERVE, str(bundle), str(tmp_path / "inputs.npz"), str(tmp_path / "scores.npy")], timeout=300)
    served = np.load(tmp_path / "scores.npy")
    assert served.shape == (len(users), data.num_items)
    np.testing.assert_allclose(served, expected.numpy(), rtol=1e-5, atol=1e-6)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["num_items"] == 300 and manifest["dim"] == 16
    assert np.load(bundle / "item_embeddings.npy").shape == (300, 16)
