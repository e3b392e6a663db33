"""model/query_encoder=gated (recsys/components/query_encoders/gated.py): SimpleX's blend of the user id and the pooled
history against a hand-computed case, the two-tower reading the blend in the user id's place, the config's rules,
and a tiny run that trains and beats popularity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from recsys.components.query_encoders.gated import GatedBlend, MeanPooling
from recsys.config import query_layout
from tests.helpers.config import tiny_config

GATED = ["model/query_encoder=gated", "model.query_encoder.dim=8"]


def test_the_blend_is_the_hand_computed_one():
    """D = D_u = 2, V = identity, a = [1, 0, 0, -1], c = 0.5: g = sigmoid(u_1 - h_2 + 0.5), h the items' mean."""
    blend = GatedBlend(2, 3, 2, pool=MeanPooling(2, 3))
    with torch.no_grad():
        blend.project.weight.copy_(torch.eye(2))
        blend.gate.weight.copy_(torch.tensor([[1.0, 0.0, 0.0, -1.0]])), blend.gate.bias.fill_(0.5)
    items = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [7.0, 7.0]], [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    user = torch.tensor([[2.0, -1.0], [0.5, 0.5]])
    out = blend(items, torch.tensor([2, 0]), user)
    h = [2.0, 1.0]  # the mean of [1, 0] and [3, 2]; the padding never counts
    g = 1 / (1 + math.exp(-(2.0 - h[1] + 0.5)))
    empty = blend.pool.empty.tolist()  # no history: the learned empty vector, blended alike
    g0 = 1 / (1 + math.exp(-(0.5 - empty[1] + 0.5)))
    expected = [[g * 2.0 + (1 - g) * h[0], g * -1.0 + (1 - g) * h[1]], [g0 * 0.5 + (1 - g0) * e for e in empty]]
    torch.testing.assert_close(out, torch.tensor(expected))


def test_the_gate_leans_on_the_user_id_or_the_history_as_it_learns():
    blend = GatedBlend(2, 3, 2, pool=MeanPooling(2, 3))
    items, lengths, user = torch.randn(4, 3, 2), torch.tensor([3, 1, 0, 2]), torch.randn(4, 2)
    with torch.no_grad():
        blend.gate.weight.zero_()
        blend.gate.bias.fill_(30.0)  # g = 1: the user id alone
        torch.testing.assert_close(blend(items, lengths, user), user)
        blend.gate.bias.fill_(-30.0)  # g = 0: the projected history alone
        torch.testing.assert_close(blend(items, lengths, user), blend.project(blend.pool(items, lengths)))


def test_the_two_tower_reads_the_blend_in_the_user_ids_place():
    """Unsharded: the query tower's input is [the blend (D_u) | the other pooled query columns], and gradients reach
    the user table through the blend."""
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    from recsys.data.features import build_kjt
    from recsys.data.layout import feature_layout
    from recsys.model.two_tower import TwoTower, table_configs

    num_rows = {"user": 5, "item": 9, "category": 3}
    dims = {"user": 4, "item": 6, "category": 2}
    configs = table_configs(num_rows=num_rows, dims=dims, poolings={t: "mean" for t in num_rows})
    sequence = EmbeddingConfig(name="sequence", num_embeddings=9, embedding_dim=8, feature_names=["sequence"])
    layout = feature_layout(history_length=3, sequence=True)
    torch.manual_seed(0)
    encoder = GatedBlend(8, 3, 4, pool=MeanPooling(8, 3))
    model = TwoTower(
        configs,
        query_tables=layout.tower_keys("query"),
        candidate_tables=["item", "category"],
        tower_dims=[7],
        sequence_table=sequence,
        sequence_encoder=encoder,
        blend_key="user",
    )
    assert model.query_keys == ["category"] and model.query_tower[0].in_features == 4 + 2
    model.ebc, model.ec = EmbeddingBagCollection(tables=configs), EmbeddingCollection(tables=[sequence])
    lengths = {  # 2 queries (histories [1, 2] and []) and 3 candidates
        "user": np.array([1, 1, 0, 0, 0]),
        "item": np.array([0, 0, 1, 1, 1]),
        "category": np.array([1, 0, 1, 1, 1]),
        "sequence": np.array([2, 0, 0, 0, 0]),
    }
    values = {
        "user": np.array([3, 4]),
        "item": np.array([5, 6, 7]),
        "category": np.array([1, 0, 1, 2]),
        "sequence": np.array([1, 2]),
    }
    queries, candidates = model(build_kjt(["user", "item", "category", "sequence"], lengths, values), 2)
    assert queries.shape == (2, 7) and candidates.shape == (3, 7)
    (queries @ candidates.T).sum().backward()
    assert model.ebc.embedding_bags["user"].weight.grad[[3, 4]].abs().sum() > 0
    assert model.ec.embeddings["sequence"].weight.grad[[1, 2]].abs().sum() > 0
    with pytest.raises(ValueError, match="blend_key='user' needs a sequence encoder"):
        TwoTower(configs, query_tables=["item"], tower_dims=[7], blend_key="user")


def test_it_needs_the_user_id_and_a_history():
    profile = tiny_config(GATED)  # a profile bag resolves the user id to false, the blend to true
    assert query_layout(profile) == {"user_id": True, "sequence": True, "query_neighbors": False}
    with pytest.raises(ValueError, match=r"model.query_user_id=False: model/query_encoder=gated blends the user id"):
        tiny_config([*GATED, "model.query_user_id=false"])
    with pytest.raises(ValueError, match=r"model.query_encoder.name='gated': .*data.history_length > 0"):
        tiny_config([*GATED, "data.history_length=0"])
    with pytest.raises(ValueError, match=r"model.query_encoder.pool='max': choose one of mean, attention"):
        tiny_config([*GATED, "model.query_encoder.pool=max"])


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_a_tiny_run_trains_and_beats_popularity(pool, tmp_path, data_root, process_group):
    from recsys.job.run import fit

    cfg = tiny_config([f"data.root={data_root}", *GATED, f"model.query_encoder.pool={pool}", "trainer.epochs=3"])
    results = fit(cfg, tmp_path / "run")
    two_tower, popularity = results["test"]["two_tower"]["recall@20"], results["test"]["popularity"]["recall@20"]
    assert two_tower > 1.15 * popularity, (two_tower, popularity)
