"""The bundle serves the query encoders that read the history per position (sasrec, attention pooling, the gated blend
of the user id): its query vectors are the trained model's, in a process that never imports torchrec, and a bundle
whose sequence_encoder entry names no such encoder is refused naming the manifest. Short tiny runs, the two-tower
served alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from recsys.config import query_layout
from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.export import ExportConfig, export_run
from recsys.job.run import fit
from recsys.job.trained import load_trained
from recsys.ranking.sharded import Evaluator, embed
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.launch import launch

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=6", "trainer.early_stopping_patience=0"]
ENCODERS = {
    "sasrec": ["model/query_encoder=sasrec", "data.query_history=recent", "model.query_encoder.num_layers=1"],
    "attention": ["model/query_encoder=attention"],
    "gated": ["model/query_encoder=gated"],  # blends the user id in: the user table ships too
}

LOAD = """
import sys, numpy as np
from recsys.serving.bundle import load_bundle
bundle = load_bundle(sys.argv[1])
inputs = np.load(sys.argv[2])
users = inputs["users"] if bundle.served.part("two_tower").reads_users else None
np.save(sys.argv[3], bundle.encode_part("two_tower", users, inputs["lengths"], inputs["items"]).numpy())
assert not any(m.startswith("torchrec") or m.startswith("fbgemm") for m in sys.modules), "serving imported torchrec"
"""


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_the_bundle_encodes_queries_as_the_trained_sequence_encoder_does(encoder, tmp_path, data_root, process_group):
    run_dir = tmp_path / "run"
    cfg = tiny_config([f"data.root={data_root}", *SHORT, "eval.serve=two_tower", *ENCODERS[encoder]])
    results = fit(cfg, run_dir)
    assert results["headline"]["servable"] is True
    bundle = export_run(ExportConfig(run_dir=str(run_dir)))
    entry = json.loads((bundle / "manifest.json").read_text())["served"]["parts"][0]["sequence_encoder"]
    assert entry["config"]["name"] == encoder and entry["max_length"] == cfg.data.history_length

    data, _, sharded, _ = load_trained(cfg, run_dir, "", process_group)
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, _, _, timeline = Evaluator(data, builder, ks=[20], batch_size=64, chunk_size=64).protocol("test")
    expected = embed(
        sharded.two_tower.eval(), builder, side="query", ids=users, timeline=timeline, batch_size=64,
        device=torch.device("cpu"),
    )  # fmt: skip
    lengths, items = latest_items(timeline, users, data.num_users, cfg.data.history_length)
    assert (lengths < cfg.data.history_length).any() and (lengths == cfg.data.history_length).any()  # padded, full
    np.savez(tmp_path / "inputs.npz", users=users, lengths=lengths, items=items)
    launch(["-c", LOAD, str(bundle), str(tmp_path / "inputs.npz"), str(tmp_path / "queries.npy")], timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "queries.npy"), expected.numpy(), rtol=1e-5, atol=1e-5)
    assert (bundle / "parts" / "0-two_tower" / "query_encoder.pt2").is_file()  # the torch.export program too


def test_a_sequence_encoder_entry_naming_no_such_encoder_is_refused(tmp_path, data_root, process_group):
    run_dir = tmp_path / "run"
    fit(tiny_config([f"data.root={data_root}", *SHORT, "eval.serve=two_tower", *ENCODERS["attention"]]), run_dir)
    bundle = export_run(ExportConfig(run_dir=str(run_dir)))
    manifest = json.loads((bundle / "manifest.json").read_text())
    refusals = {
        "transformer": r"manifest\.json: sequence_encoder\.config\.name is 'transformer', expected one of attention",
        "bag": r"manifest\.json: sequence_encoder\.config\.name='bag' reads no sequence",  # it pools the bag
    }
    for name, refusal in refusals.items():
        manifest["served"]["parts"][0]["sequence_encoder"]["config"] = {"name": name}
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match=refusal):
            load_bundle(bundle)
