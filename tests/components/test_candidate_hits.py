"""model.loss.mask_history: a candidate whose item is in its query's history bag is masked, as an accidental hit is
(a dense mask built without a host sync, for any block of rows)."""

import pytest
import torch

from recsys.components.losses.candidate_hits import QueryHistory
from recsys.components.losses.ccl import Config as CclConfig
from recsys.components.losses.ccl import cosine_contrastive_loss
from recsys.components.losses.in_batch_softmax import masked_logits, sampled_softmax_loss
from recsys.components.losses.softmax import Config as SoftmaxConfig


def brute_force(lengths, items, candidate_item_ids, labels):
    """[B, C]: True where candidate c's item is one of query r's history items, the label column excepted."""
    mask = torch.zeros(lengths.numel(), candidate_item_ids.numel(), dtype=torch.bool)
    bags = torch.split(items, lengths.tolist())
    for r, bag in enumerate(bags):
        for c, item in enumerate(candidate_item_ids.tolist()):
            mask[r, c] = item in bag.tolist() and c != labels[r]
    return mask


def test_a_hand_computed_case():
    # candidates' items 5 3 5 8 1; query 0's bag {3, 5}: columns 0-2 (the loss then unmasks each row's label),
    # query 1's {8, 9} (9 is no candidate), query 2's empty
    candidates = torch.tensor([5, 3, 5, 8, 1])
    lengths, items = torch.tensor([2, 2, 0]), torch.tensor([3, 5, 8, 9])
    history = QueryHistory.of(lengths, items, candidates)
    mask = history.mask(0, 3)
    assert sorted(map(tuple, mask.nonzero().tolist())) == [(0, 0), (0, 1), (0, 2), (1, 3)]
    # a block of rows [1, 3): rows relative to the block
    assert history.mask(1, 3).nonzero().tolist() == [[0, 3]]


@pytest.mark.parametrize("block", [(0, 40), (0, 17), (17, 40), (39, 40)])
def test_the_mask_of_any_row_block_equals_a_brute_force(block):
    g = torch.Generator().manual_seed(3)
    candidates = torch.randint(0, 25, (90,), generator=g)  # many repeats
    lengths = torch.randint(0, 8, (40,), generator=g)
    items = torch.randint(0, 30, (int(lengths.sum()),), generator=g)  # some items no candidate holds
    labels = torch.randint(0, 90, (40,), generator=g)
    expected = brute_force(lengths, items, candidates, labels)
    lo, hi = block
    history = QueryHistory.of(lengths, items, candidates)
    mask = history.mask(lo, hi)
    mask[torch.arange(hi - lo), labels[lo:hi]] = False
    assert torch.equal(mask, expected[lo:hi])
    assert expected.sum() > 40  # the case has plenty to find


def test_the_loss_masks_the_history_and_nothing_else():
    g = torch.Generator().manual_seed(4)
    q = torch.nn.functional.normalize(torch.randn(3, 4, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(5, 4, generator=g), dim=-1)
    items = torch.tensor([10, 11, 12, 13, 14])
    args = dict(labels=torch.arange(3), query_item_ids=items[:3], candidate_item_ids=items, temperature=0.5)
    history = (torch.tensor([1, 0, 2]), torch.tensor([13, 14, 10]))  # query 2 holds query 0's item 10 and item 14
    plain = masked_logits(q, c, **args)
    masked = masked_logits(q, c, **args, history=QueryHistory.of(*history, items))
    assert sorted(map(tuple, torch.isinf(masked).nonzero().tolist())) == [(0, 3), (2, 0), (2, 4)]
    assert torch.equal(masked[~torch.isinf(masked)], plain[~torch.isinf(masked)])
    # the loss: each row's cross-entropy over its unmasked columns
    logits = q @ c.t() / 0.5
    expected = 0.0
    for r, keep in enumerate(([0, 1, 2, 4], [0, 1, 2, 3, 4], [1, 2, 3])):
        expected += torch.logsumexp(logits[r, keep], 0) - logits[r, r]
    assert sampled_softmax_loss(q, c, **args, query_history=history).item() == pytest.approx(expected.item() / 3)


def test_ccl_leaves_the_history_out_of_its_negatives():
    g = torch.Generator().manual_seed(5)
    q = torch.nn.functional.normalize(torch.randn(2, 4, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(4, 4, generator=g), dim=-1)
    items = torch.tensor([20, 21, 22, 23])
    args = dict(labels=torch.arange(2), query_item_ids=items[:2], candidate_item_ids=items, margin=-1.0)
    got = cosine_contrastive_loss(q, c, **args, negative_weight=2.0, query_history=(torch.tensor([1, 0]), items[2:3]))
    sims = q @ c.t()
    # margin -1: every negative's hinge is cos + 1; query 0's negatives: column 1 and 3 (22 in its bag), query 1's: 0, 2, 3
    expected = (1 - sims[0, 0] + 2.0 * (sims[0, [1, 3]] + 1).mean()) + (
        1 - sims[1, 1] + 2.0 * (sims[1, [0, 2, 3]] + 1).mean()
    )
    assert got.item() == pytest.approx(expected.item() / 2, rel=1e-6)


def test_each_loss_reads_the_history_only_when_asked():
    for config in (SoftmaxConfig, CclConfig):
        assert not config(mask_history=False).build().reads_query_history
        assert config(mask_history=True).build().reads_query_history
