"""model.negatives: a pool drawn for the whole batch from counts**exponent, whose logQ is that distribution's, and
the whole catalogue as the candidates (a full softmax), equal to the in-batch softmax without logQ when the batch
holds each item once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.components.losses.ccl import Config as CclConfig
from recsys.components.losses.softmax import Config as SoftmaxConfig
from recsys.data.batch import Batch
from recsys.data.negatives import NegativeSampler, sampling_probs
from recsys.model.task import RetrievalTask
from tests.helpers.config import tiny_config

COUNTS = np.array([1.0, 3.0, 6.0, 0.0, 10.0])


def test_the_pool_is_drawn_from_counts_to_the_exponent():
    for exponent in (0.5, 1.0):
        expected = COUNTS**exponent / (COUNTS**exponent).sum()
        assert sampling_probs(COUNTS, exponent) == pytest.approx(expected)
        draws = NegativeSampler(200_000, exponent, len(COUNTS), lambda: COUNTS).draw(np.random.default_rng(0))
        freq = np.bincount(draws, minlength=len(COUNTS)) / len(draws)
        assert freq == pytest.approx(expected, abs=0.005)  # 4 standard errors of the largest share
        assert freq[3] == 0  # never trained on: never drawn
    uniform = NegativeSampler(6, 0.0, len(COUNTS), lambda: COUNTS).draw(np.random.default_rng([1, 2]))
    assert np.array_equal(uniform, np.random.default_rng([1, 2]).integers(0, 5, 6))  # earlier runs' draws


def test_the_pools_log_q_is_its_sampling_distributions():
    """q(i) = (B p(i) + B' s(i)) / (B + B'): p the training frequency, s = counts**e / sum."""
    counts = torch.tensor(COUNTS)
    ids = torch.arange(5)
    for exponent in (0.0, 0.75, 1.0):
        task = RetrievalTask(
            nn.Identity(),
            item_counts=counts,
            loss=SoftmaxConfig(mask_history=False).build(),
            num_negatives=3,
            negative_exponent=exponent,
        )
        p, s = COUNTS / COUNTS.sum(), sampling_probs(COUNTS, exponent)
        expected = np.log(np.maximum((8 * p + 3 * s) / 11, 1e-12))
        assert task.candidate_log_q(ids, global_batch_size=8).numpy() == pytest.approx(expected, rel=1e-5)
    # exponent 1: the pool is drawn as the positives are, so q is the training frequency itself
    task = RetrievalTask(
        nn.Identity(),
        item_counts=counts,
        loss=SoftmaxConfig(mask_history=False).build(),
        num_negatives=3,
        negative_exponent=1,
    )
    assert task.candidate_log_q(ids[:3], 8).exp().numpy() == pytest.approx(COUNTS[:3] / COUNTS.sum(), rel=1e-5)


class _Vectors(nn.Module):
    """A stand-in two-tower: the batch's query vectors and candidate vectors, fixed."""

    def __init__(self, queries: torch.Tensor, candidates: torch.Tensor) -> None:
        super().__init__()
        self.queries, self.candidates = nn.Parameter(queries), nn.Parameter(candidates)

    def forward(self, features, num_queries):
        return self.queries, self.candidates


def _batch(positives: torch.Tensor, negatives: torch.Tensor) -> Batch:
    ids = torch.cat([positives, negatives])
    features = KeyedJaggedTensor.from_lengths_sync(["item"], ids, torch.ones(len(ids), dtype=torch.int32))
    return Batch(features=features, candidate_item_ids=ids, num_queries=len(positives))


@pytest.mark.parametrize(
    "loss", [SoftmaxConfig(temperature=0.3, logq_correction=False, mask_history=False), CclConfig(margin=0.2)]
)
def test_the_full_softmax_is_the_in_batch_one_when_the_batch_holds_each_item_once(loss):
    torch.manual_seed(0)
    num_items, dim = 6, 4
    item_vectors = nn.functional.normalize(torch.randn(num_items, dim), dim=1)
    queries = nn.functional.normalize(torch.randn(num_items, dim), dim=1)
    positives = torch.randperm(num_items)  # each item the positive of one query
    counts = torch.ones(num_items)
    in_batch = RetrievalTask(
        _Vectors(queries, item_vectors[positives]), item_counts=counts, loss=loss.build(), num_negatives=0
    )
    catalogue = torch.cat([item_vectors[positives], item_vectors])  # positives' rows, then every item in order
    full = RetrievalTask(_Vectors(queries, catalogue), item_counts=counts, loss=loss.build(), num_negatives=-1)
    expected = in_batch(_batch(positives, torch.zeros(0, dtype=torch.int64)))[0]
    got = full(_batch(positives, torch.arange(num_items)))[0]
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    expected.backward(), got.backward()
    assert torch.allclose(full.model.queries.grad, in_batch.model.queries.grad, atol=1e-6)
    # the catalogue's rows get the gradient the in-batch positives' rows got, the positives' copies none
    grad = full.model.candidates.grad
    assert torch.allclose(grad[num_items:][positives], in_batch.model.candidates.grad, atol=1e-6)
    assert torch.count_nonzero(grad[:num_items]) == 0


@pytest.mark.parametrize(
    "negatives",
    [
        ["model.negatives.num=-1"],
        ["model.negatives.num=64", "model.negatives.exponent=0.75"],
        ["model.negatives.num=-1", "model.loss.mask_history=true"],
    ],
)
def test_a_run_trains_with_each_kind_of_negatives(tmp_path, data_root, process_group, negatives):
    from recsys.job.run import fit

    cfg = tiny_config([f"data.root={data_root}", "trainer.epochs=2", *negatives])
    results = fit(cfg, tmp_path)
    # it learns: past popularity on valid within two epochs (the default negatives reach 0.29 against 0.20 in six)
    assert results["valid"]["two_tower"]["recall@20"] > results["valid"]["popularity"]["recall@20"]
