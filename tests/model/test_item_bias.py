"""model.item_bias: the candidate tower's last output is the item's logit bias, the query's a constant 1, so that
<query, candidate> = <q, c> + b stays one dot product of the towers' last width; the bundle serves it exactly."""

from __future__ import annotations

import json

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from data_pipelines.errors import ConfigError
from data_pipelines.prepare import prepare_dataset
from recsys.components.losses.in_batch_softmax import sampled_softmax_loss
from recsys.export import ExportConfig, export_run
from recsys.job.assemble import open_dataset
from recsys.job.run import fit
from recsys.model.two_tower import TwoTower
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config
from tests.helpers.served_ranking import assert_bundle_ranks_test_as_the_run


def _model(item_bias: bool) -> TwoTower:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=10, feature_names=[n], pooling=PoolingType.MEAN)
        for n in ("user", "item")
    ]
    model = TwoTower(tables, query_tables=["user"], candidate_tables=["item"], tower_dims=[6], item_bias=item_bias)
    model.ebc = type(model.ebc)(tables=tables, device=torch.device("cpu"))  # materialised for the test
    return model


def _features() -> KeyedJaggedTensor:
    # 3 queries (user ids) then 4 candidates (item ids): stride 7, one id a row where its tower reads it
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item"],
        values=torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        lengths=torch.tensor([1, 1, 1, 0, 0, 0, 0] + [0, 0, 0, 1, 1, 1, 1]),
    )


def test_the_bias_is_the_candidates_last_column_met_by_a_constant_query_column():
    model = _model(item_bias=True)
    assert model.query_tower[-1].out_features == 5  # + the constant column: 6 in all
    queries, candidates = model(_features(), num_queries=3)
    assert queries.shape == (3, 6) and candidates.shape == (4, 6)
    assert torch.equal(queries[:, -1], torch.ones(3))
    torch.testing.assert_close(queries[:, :-1].norm(dim=1), torch.ones(3))
    torch.testing.assert_close(candidates[:, :-1].norm(dim=1), torch.ones(4))
    bias = candidates[:, -1]
    assert bias.abs().min() > 0  # the tower's own output, not a constant
    # a score is the cosine of the unit parts plus the item's bias: one dot product
    torch.testing.assert_close(queries @ candidates.T, queries[:, :-1] @ candidates[:, :-1].T + bias[None, :])
    # and the softmax's logits are that score over the temperature: (cos + b) / tau
    labels = torch.tensor([0, 1, 2])
    loss = sampled_softmax_loss(
        queries, candidates, labels=labels, query_item_ids=torch.tensor([4, 5, 6]),
        candidate_item_ids=torch.tensor([4, 5, 6, 7]), temperature=0.1, candidate_log_q=None,
    )  # fmt: skip
    logits = (queries[:, :-1] @ candidates[:, :-1].T + bias[None, :]) / 0.1
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels))


def test_without_the_bias_both_towers_end_unit_vectors_of_the_full_width():
    queries, candidates = _model(item_bias=False)(_features(), num_queries=3)
    torch.testing.assert_close(queries.norm(dim=1), torch.ones(3))
    torch.testing.assert_close(candidates.norm(dim=1), torch.ones(4))


def test_the_default_is_on_with_the_softmax_and_off_with_ccl():
    assert tiny_config().model.uses_item_bias
    assert not tiny_config(["model/loss=ccl"]).model.uses_item_bias
    assert not tiny_config(["model.item_bias=false"]).model.uses_item_bias


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.tower_dims=[1]"], "model.item_bias needs a last width >= 2"),
        (["model/loss=ccl"], "model.item_bias=True: needs model/loss=softmax"),
    ],
)
def test_a_bias_the_model_cannot_hold_is_refused_naming_the_key(overrides, message):
    from recsys.config import check_values

    with pytest.raises(ConfigError, match=message):
        check_values(tiny_config(["model.item_bias=true", *overrides]))


def test_a_run_with_the_bias_is_exported_and_served_as_it_ranked(tmp_path, data_root, process_group):
    overrides = [f"data.root={data_root}", "trainer.epochs=2", "model.item_bias=true", "eval.serve=two_tower"]
    cfg = tiny_config(overrides)
    run_dir = tmp_path / "run"
    results = fit(cfg, run_dir)
    assert results["headline"]["ranker"] == "two_tower"
    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["served"]["parts"][0]["item_bias"] is True
    bundle = load_bundle(bundle_dir)
    assert_bundle_ranks_test_as_the_run(bundle, run_dir, cfg, open_dataset(cfg, prepare_dataset(cfg.data)))
    # a manifest whose item_bias is no boolean is refused, naming the manifest and the value
    manifest["served"]["parts"][0]["item_bias"] = "yes"
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"manifest.json: item_bias is 'yes', expected true or false"):
        load_bundle(bundle_dir)
