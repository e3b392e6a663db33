"""The retrieval loss against a naive reference written with explicit loops."""

import math

import pytest
import torch

from recsys.components.losses.in_batch_softmax import accidental_hits, masked_logits, sampled_softmax_loss
from recsys.components.losses.softmax import Config as SoftmaxConfig
from recsys.model.task import RetrievalTask


def naive_loss(q, c, labels, q_items, c_items, tau, log_q):
    """mean_u -log softmax over candidates j not an accidental hit of u, of s(u,j) = <q,c>/tau - log q_j."""
    total = 0.0
    for u in range(q.shape[0]):
        scores = []
        for j in range(c.shape[0]):
            if j != labels[u] and c_items[j] == q_items[u]:
                continue  # accidental hit: the query's own positive item in another column
            s = float(q[u] @ c[j]) / tau - (float(log_q[j]) if log_q is not None else 0.0)
            scores.append((j, s))
        m = max(s for _, s in scores)
        log_z = m + math.log(sum(math.exp(s - m) for _, s in scores))
        pos = dict(scores)[int(labels[u])]
        total += log_z - pos
    return total / q.shape[0]


@pytest.mark.parametrize("use_log_q", [True, False])
def test_loss_matches_naive_reference_with_hits_and_uniform_negatives(use_log_q):
    g = torch.Generator().manual_seed(0)
    num_items, b, b_neg, d = 12, 6, 4, 5
    q = torch.nn.functional.normalize(torch.randn(b, d, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(b + b_neg, d, generator=g), dim=-1)
    # queries 0 and 3 share item 7 (an in-batch accidental hit); negative 2 is item 1 = query 1's positive
    pos_items = torch.tensor([7, 1, 2, 7, 4, 5])
    neg_items = torch.tensor([9, 10, 1, 11])
    c_items = torch.cat([pos_items, neg_items])
    counts = torch.tensor([3, 5, 1, 1, 2, 4, 1, 8, 1, 1, 1, 1], dtype=torch.float32)
    p = counts / counts.sum()
    log_q = torch.log((b * p[c_items] + b_neg / num_items) / (b + b_neg)) if use_log_q else None
    labels = torch.arange(b)

    args = dict(
        labels=labels, query_item_ids=pos_items, candidate_item_ids=c_items, temperature=0.1, candidate_log_q=log_q
    )
    loss = sampled_softmax_loss(q, c, **args)
    logits = masked_logits(q, c, **args)
    expected = naive_loss(q.numpy(), c.numpy(), labels.numpy(), pos_items.numpy(), c_items.numpy(), 0.1, log_q)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # exactly the accidental hits are masked: (0,3), (3,0), (1, neg 2 = column 8)
    masked = torch.isinf(logits).nonzero().tolist()
    assert sorted(map(tuple, masked)) == [(0, 3), (1, 8), (3, 0)]


def test_task_mixture_log_q_and_forward_equal_reference():
    """RetrievalTask's q(i) is the mixture (B p(i) + B'/N)/(B + B')."""
    counts = torch.tensor([1.0, 3.0, 6.0, 0.0])
    task = RetrievalTask(
        torch.nn.Identity(), item_counts=counts, loss=SoftmaxConfig(temperature=1.0).build(), num_negatives=2
    )
    ids = torch.tensor([0, 1, 2, 3])
    got = task.candidate_log_q(ids, global_batch_size=8).exp()
    p = counts / counts.sum()
    expected = (8 * p + 2 / 4) / 10
    assert torch.allclose(got, expected)
    # an item never seen in training still gets the uniform share, not log(0)
    assert got[3].item() == pytest.approx(0.05)


def test_loss_gradient_flows_to_both_towers():
    q = torch.randn(4, 3, requires_grad=True)
    c = torch.randn(4, 3, requires_grad=True)
    loss = sampled_softmax_loss(
        q,
        c,
        labels=torch.arange(4),
        query_item_ids=torch.arange(4),
        candidate_item_ids=torch.arange(4),
        temperature=0.5,
    )
    loss.backward()
    assert q.grad.abs().sum() > 0 and c.grad.abs().sum() > 0


def autograd_reference(q, c, labels, q_items, c_items, tau, log_q, history=None):
    """The loss written the obvious way, differentiated by autograd; ``history``: (lengths, items) of each query's
    bag, whose items' candidates are masked too."""
    logits = q @ c.t() / tau - (log_q.unsqueeze(0) if log_q is not None else 0.0)
    hits = c_items.unsqueeze(0) == q_items.unsqueeze(1)
    if history is not None:
        for r, bag in enumerate(torch.split(history[1], history[0].tolist())):
            hits[r] |= torch.isin(c_items, bag)
    hits[torch.arange(labels.numel()), labels] = False
    return torch.nn.functional.cross_entropy(logits.masked_fill(hits, float("-inf")), labels)


@pytest.mark.parametrize("block_rows", [0, 64, 10], ids=["dense", "one-block", "blocks-of-10"])
@pytest.mark.parametrize("device_variant", [False, True], ids=["cpu-variant", "cuda-variant"])
@pytest.mark.parametrize("use_log_q,mask_history", [(True, False), (False, False), (True, True)])
def test_hand_written_backward_equals_autograd(use_log_q, mask_history, device_variant, block_rows, monkeypatch):
    """Random batches with many repeated items (accidental hits) and uniform negatives; labels offset as on rank 1.
    ``cuda-variant`` runs on CPU what runs on a GPU (dense hit mask, out-of-place log_softmax); ``block_rows`` > 0:
    the row-blocked form with a logits budget of that many rows (64, the whole batch, runs the dense form);
    ``mask_history``: each query's bag of up to 6 items masked too (model.loss.mask_history)."""
    import recsys.components.losses.in_batch_softmax as softmax_module

    if device_variant:
        monkeypatch.setattr(softmax_module, "_on_host", lambda t: False)
    g = torch.Generator().manual_seed(1)
    b, c_rows, d, tau = 64, 160, 16, 0.07
    q0 = torch.nn.functional.normalize(torch.randn(b, d, generator=g), dim=-1)
    c0 = torch.nn.functional.normalize(torch.randn(c_rows, d, generator=g), dim=-1)
    c_items = torch.randint(0, 40, (c_rows,), generator=g)
    labels = torch.arange(32, 32 + b)  # this rank's positives sit after another rank's
    q_items = c_items[labels]
    log_q = torch.log(torch.rand(c_rows, generator=g) * 0.01 + 1e-4) if use_log_q else None
    history = None
    if mask_history:
        lengths = torch.randint(0, 7, (b,), generator=g)
        history = (lengths, torch.randint(0, 45, (int(lengths.sum()),), generator=g))
    grads = []
    for fn in (sampled_softmax_loss, None):
        q, c = q0.clone().requires_grad_(), c0.clone().requires_grad_()
        if fn is None:
            loss = autograd_reference(q, c, labels, q_items, c_items, tau, log_q, history)
        else:
            loss = fn(
                q,
                c,
                labels=labels,
                query_item_ids=q_items,
                candidate_item_ids=c_items,
                temperature=tau,
                candidate_log_q=log_q,
                block_mb=block_rows * c_rows * 4 / 2**20,
                query_history=history,
            )
        (3.0 * loss).backward()  # a non-unit upstream gradient must scale the result
        grads.append((loss.item(), q.grad, c.grad))
    (l1, gq1, gc1), (l2, gq2, gc2) = grads
    assert l1 == pytest.approx(l2, rel=1e-6)
    # float32 GEMMs summed in another order: allow 1e-5 of the largest gradient (a wrong backward is off by O(1) of it)
    torch.testing.assert_close(gq1, gq2, rtol=1e-5, atol=1e-5 * gq2.abs().max().item())
    torch.testing.assert_close(gc1, gc2, rtol=1e-5, atol=1e-5 * gc2.abs().max().item())
    assert gq1.abs().sum() > 0 and gc1.abs().sum() > 0


def test_accidental_hits_equal_dense_comparison():
    g = torch.Generator().manual_seed(2)
    c_items = torch.randint(0, 30, (200,), generator=g)
    labels = torch.randperm(200, generator=g)[:50]
    q_items = c_items[labels]
    q_items[:5] = 99  # a query whose item is nowhere among the candidates (its label column is then no hit either)
    dense = c_items.unsqueeze(0) == q_items.unsqueeze(1)
    dense[torch.arange(50), labels] = False
    rows, cols = accidental_hits(q_items, c_items, labels)
    assert sorted(zip(rows.tolist(), cols.tolist())) == sorted(map(tuple, dense.nonzero().tolist()))
    assert rows.numel() > 50  # the case has plenty of hits to find


def test_backward_twice_is_an_error():
    q = torch.randn(4, 3, requires_grad=True)
    loss = sampled_softmax_loss(
        q,
        torch.randn(4, 3),
        labels=torch.arange(4),
        query_item_ids=torch.arange(4),
        candidate_item_ids=torch.arange(4),
        temperature=0.5,
    )
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_cosine_contrastive_loss_matches_naive_reference():
    """SimpleX's CCL: (1 - cos+) + w * mean over non-hit negatives of max(0, cos - m)."""
    from recsys.components.losses.ccl import cosine_contrastive_loss

    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(4, 3, generator=g), dim=-1)
    c = torch.nn.functional.normalize(torch.randn(7, 3, generator=g), dim=-1)
    pos_items = torch.tensor([5, 6, 5, 8])  # queries 0 and 2 share item 5: an accidental hit
    c_items = torch.cat([pos_items, torch.tensor([6, 9, 10])])  # column 4 is query 1's positive item
    labels = torch.arange(4)
    margin, weight = 0.1, 3.0
    expected = 0.0
    for u in range(4):
        negatives = [j for j in range(7) if j != u and c_items[j] != pos_items[u]]
        hinge = sum(max(0.0, float(q[u] @ c[j]) - margin) for j in negatives) / len(negatives)
        expected += (1.0 - float(q[u] @ c[u])) + weight * hinge
    got = cosine_contrastive_loss(
        q, c, labels=labels, query_item_ids=pos_items, candidate_item_ids=c_items, margin=margin, negative_weight=weight
    )
    assert got.item() == pytest.approx(expected / 4, rel=1e-5)
    assert 0.0 < got.item()


@pytest.mark.parametrize("use_log_q", [True, False])
def test_bf16_autocast_loss_is_close_to_fp32_and_hands_back_fp32(use_log_q):
    """trainer.precision=bf16: the GEMMs run in bfloat16, the scores, the softmax and the gradients stay fp32,
    so loss and gradients are within bf16's rounding of the fp32 ones (a bf16 softmax would be ~10x further)."""
    g = torch.Generator().manual_seed(2)
    b, c_rows, d, tau = 128, 192, 64, 0.1
    q0 = torch.nn.functional.normalize(torch.randn(b, d, generator=g), dim=-1)
    c0 = torch.nn.functional.normalize(torch.randn(c_rows, d, generator=g), dim=-1)
    c_items = torch.randint(0, 60, (c_rows,), generator=g)
    labels = torch.arange(b)
    q_items = c_items[labels]
    log_q = torch.log(torch.rand(c_rows, generator=g) * 0.01 + 1e-4) if use_log_q else None
    args = dict(
        labels=labels, query_item_ids=q_items, candidate_item_ids=c_items, temperature=tau, candidate_log_q=log_q
    )
    results = []
    for bf16 in (False, True):
        q, c = q0.clone().requires_grad_(), c0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = sampled_softmax_loss(q, c, **args)
            logits = masked_logits(q0, c0, **args)
        loss.backward()  # outside the autocast region, as the plain training loop runs it
        results.append((loss, logits, q.grad, c.grad))
    (l32, s32, gq32, gc32), (l16, s16, gq16, gc16) = results
    assert l16.dtype == s16.dtype == gq16.dtype == gc16.dtype == torch.float32
    assert torch.equal(torch.isinf(s16), torch.isinf(s32))  # the same accidental hits masked
    assert not torch.equal(s16, s32)  # the GEMM did run in bf16
    finite = ~torch.isinf(s32)
    assert (s16 - s32)[finite].abs().max().item() < 0.1  # |cos| <= 1 rounded to 8 bits, over tau = 0.1
    assert l16.item() == pytest.approx(l32.item(), rel=2e-3)
    for got, want in ((gq16, gq32), (gc16, gc32)):
        assert ((got - want).norm() / want.norm()).item() < 0.02
