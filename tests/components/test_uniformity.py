"""The uniformity term (recsys/components/losses/uniformity.py) and the softmax loss's uniformity_weight."""

import math

import pytest
import torch

from recsys.components.losses.softmax import Config as SoftmaxConfig
from recsys.components.losses.uniformity import uniformity


def test_uniformity_by_hand():
    e1, e2 = torch.eye(2)
    # two orthogonal unit vectors: ||x - y||^2 = 2, so log exp(-2 * 2) = -4
    assert uniformity(torch.stack([e1, e2])).item() == pytest.approx(-4.0)
    # e1, e1, e2: of the 6 ordered pairs, 2 at distance 0 and 4 at squared distance 2
    assert uniformity(torch.stack([e1, e1, e2])).item() == pytest.approx(math.log((2 + 4 * math.exp(-4)) / 6))
    # t scales the exponent; one vector has no pair
    assert uniformity(torch.stack([e1, e2]), t=1.0).item() == pytest.approx(-2.0)
    assert uniformity(e1[None]).item() == 0.0


def test_spread_vectors_score_lower_than_crowded_ones():
    torch.manual_seed(0)
    spread = torch.nn.functional.normalize(torch.randn(64, 16), dim=1)
    crowded = torch.nn.functional.normalize(torch.randn(64, 16) * 0.1 + torch.ones(16), dim=1)
    assert uniformity(spread).item() < uniformity(crowded).item() - 1.0


def test_the_softmax_adds_the_weighted_uniformity_of_its_unit_columns():
    torch.manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(6, 4), dim=1)
    c = torch.nn.functional.normalize(torch.randn(9, 4), dim=1)
    # the item bias's layout: the queries' last column 1, the candidates' their bias; unit_dims = 4 leaves it out
    q_b, c_b = torch.cat([q, torch.ones(6, 1)], 1), torch.cat([c, torch.randn(9, 1)], 1)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    args = dict(labels=labels, query_item_ids=labels, candidate_item_ids=torch.arange(9), log_q=torch.zeros(9))
    plain = SoftmaxConfig().build()(q_b, c_b, **args, unit_dims=4)
    weighted = SoftmaxConfig(uniformity_weight=0.5).build()(q_b, c_b, **args, unit_dims=4)
    expected = plain + 0.5 * (uniformity(q) + uniformity(c[labels])) / 2
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-6)
    assert weighted.item() != pytest.approx(plain.item())
