"""model/query_encoder=attention (recsys/components/query_encoders/attention.py): the pooled vector against a hand-computed
case, what it is invariant to (padding, the items' order), the config's rules (a profile bag is read as a recent
history is) and a tiny run on the profile bags that trains and beats popularity."""

from __future__ import annotations

import math

import pytest
import torch

from recsys.components.query_encoders.attention import AttentionPooling
from recsys.config import query_layout
from tests.helpers.config import tiny_config

ATTENTION = ["model/query_encoder=attention", "model.query_encoder.dim=8", "model.query_encoder.hidden=4"]


def hand_set(pool: AttentionPooling, W, b, w) -> AttentionPooling:
    with torch.no_grad():
        pool.project.weight.copy_(torch.tensor(W)), pool.project.bias.copy_(torch.tensor(b))
        pool.score.weight.copy_(torch.tensor([w]))
    return pool


def test_the_pooled_vector_is_the_hand_computed_one():
    """D = 2, hidden 1: W = [1, -1], b = 0.5, w = 2, so s_h = 2 tanh(e_h1 - e_h2 + 0.5)."""
    pool = hand_set(AttentionPooling(2, 3, hidden=1), [[1.0, -1.0]], [0.5], [2.0])
    items = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]],  # two items, then padding (never weighed)
            [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]],  # no history: the learned empty vector
            [[-1.0, 4.0], [9.0, 9.0], [9.0, 9.0]],  # one item: itself, whatever its score
        ]
    )
    out = pool(items, torch.tensor([2, 0, 1]))
    s1, s2 = 2 * math.tanh(1.0 - 0.0 + 0.5), 2 * math.tanh(0.0 - 2.0 + 0.5)
    a1 = math.exp(s1) / (math.exp(s1) + math.exp(s2))
    expected = torch.tensor([[a1 * 1.0, (1 - a1) * 2.0], pool.empty.tolist(), [-1.0, 4.0]])
    torch.testing.assert_close(out, expected)


def test_neither_padding_nor_the_items_order_changes_the_query_and_gradients_are_finite():
    torch.manual_seed(0)
    pool = AttentionPooling(6, 7, hidden=5)
    items, lengths = torch.randn(4, 7, 6, requires_grad=True), torch.tensor([3, 0, 7, 1])
    real = (torch.arange(7)[None, :] < lengths[:, None])[..., None]
    out = pool(items, lengths)
    torch.testing.assert_close(pool(torch.where(real, items, torch.randn(4, 7, 6)), lengths), out)
    shuffled = items.detach().clone()
    shuffled[0, :3] = shuffled[0, [2, 0, 1]]
    torch.testing.assert_close(pool(shuffled, lengths), out)
    out.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in [items, *pool.parameters()])
    assert items.grad[0, 3:].abs().sum() == 0 and items.grad[1].abs().sum() == 0  # padding weighs nothing
    assert pool.empty.grad.abs().sum() > 0  # the user without history
    assert pool(items[:0], lengths[:0]).shape == (0, 6)  # candidate-only batches


def test_it_reads_the_profile_bag_as_well_as_a_recent_history():
    profile = tiny_config(ATTENTION)  # the tiny run's profile bags
    assert profile.data.query_history == "profile" and query_layout(profile)["sequence"]
    assert profile.model.query_encoder.build(10).max_length == 10
    recent = tiny_config([*ATTENTION, "data/protocol=loo", "data.query_history=recent"])
    assert query_layout(recent)["sequence"]
    with pytest.raises(ValueError, match=r"model.query_encoder.name='attention': .*data.history_length > 0"):
        tiny_config([*ATTENTION, "data.history_length=0", "model.query_user_id=true"])
    with pytest.raises(ValueError, match=r"model.query_encoder.hidden=0: must be >= 1"):
        tiny_config([*ATTENTION[:2], "model.query_encoder.hidden=0"])


def test_a_tiny_run_on_profile_bags_trains_and_beats_popularity(tmp_path, data_root, process_group):
    from recsys.job.run import fit

    results = fit(tiny_config([f"data.root={data_root}", *ATTENTION]), tmp_path / "run")
    two_tower, popularity = results["test"]["two_tower"]["recall@20"], results["test"]["popularity"]["recall@20"]
    assert two_tower > 1.15 * popularity, (two_tower, popularity)
