"""The in-batch softmax cross-entropy: masked logits, a dense form and a row-blocked form of bounded memory.

Scores s(u, i) = <q(u), c(i)> / tau - log q(i) over every candidate, accidental hits (a candidate whose item is
the query's positive, the positive itself excepted) at -inf; the loss is the mean over queries of
-log softmax(s(u, .))[label(u)]. Both forms hand-write the backward:

- **dense** (``_InBatchSoftmaxCrossEntropy``): one B_q x C buffer of log-probabilities kept from forward to backward;
- **blocked** (``_BlockedInBatchSoftmaxCrossEntropy``): row blocks of at most ``block_rows`` queries; each block's
  logits, softmax and gradient GEMMs run in the forward (the loss is a scalar: backward only scales the two
  gradients), so memory grows as block_rows x C, not B_q x C, for the same three GEMMs.
"""

from __future__ import annotations

import torch

from recsys.components.losses.candidate_hits import QueryHistory, accidental_hits, sorted_candidates


def _on_host(t: torch.Tensor) -> bool:
    """Which variant of the loss's two device-dependent steps runs: on CPU the sorted accidental
    hits and the in-place log_softmax; elsewhere the dense hit mask (no host sync to size the
    pairs) and an out-of-place log_softmax. Tests flip it to run the device variant on CPU."""
    return t.device.type == "cpu"


def matmul_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype the loss's GEMMs run in (trainer.precision), or None outside autocast."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def masked_logits(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    *,
    labels: torch.Tensor,
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    temperature: float,
    candidate_log_q: torch.Tensor | None = None,
    candidates_sorted: tuple[torch.Tensor, torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
    history: QueryHistory | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """``B_q x C`` fp32 scores <q, c> / tau - log q(c), accidental hits set to -inf (no autograd), and with
    ``history`` each query's own history items too (``first_row``: the query rows' offset in ``history``).

    Under autocast (trainer.precision=bf16) only the GEMM runs in the autocast dtype (fp32 accumulation):
    the scores are fp32 before the bias, so the softmax never sees bf16's 3 significant digits.
    ``candidates_sorted``: ``sorted_candidates(candidate_item_ids)`` when the caller has it; ``out``: an fp32
    ``B_q x C`` buffer to write into (fp32 GEMMs only), so that row blocks reuse one allocation.
    """
    with torch.no_grad():
        # autocast's dtype, or the operands' own when the caller converted them already (the blocked form)
        dtype = matmul_dtype(queries.device) or (None if queries.dtype == torch.float32 else queries.dtype)
        if dtype is not None:
            with torch.autocast(queries.device.type, enabled=False):
                logits = torch.mm(queries.to(dtype), candidates.to(dtype).t()).float().mul_(1.0 / temperature)
            if candidate_log_q is not None:
                logits.sub_(candidate_log_q.unsqueeze(0))
        elif candidate_log_q is not None:
            # the logQ row is the GEMM's bias and 1/tau its alpha: no extra B_q x C pass for either
            bias = candidate_log_q.neg().unsqueeze(0)
            logits = torch.addmm(bias, queries, candidates.t(), alpha=1.0 / temperature, out=out)
        else:
            logits = torch.mm(queries, candidates.t(), out=out).mul_(1.0 / temperature)
        if _on_host(logits):
            hits = accidental_hits(query_item_ids, candidate_item_ids, labels, candidates_sorted)
            logits.index_put_(hits, torch.tensor(float("-inf")))
            if history is not None:  # dense on the host too: 4x faster than searching its pairs (bench_loss.py)
                mask = history.mask(first_row, first_row + labels.numel())
                mask[torch.arange(labels.numel(), device=labels.device), labels] = False
                logits.masked_fill_(mask, float("-inf"))
        else:
            hits = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)
            if history is not None:
                hits |= history.mask(first_row, first_row + labels.numel())
            hits[torch.arange(labels.numel(), device=labels.device), labels] = False
            logits.masked_fill_(hits, float("-inf"))
    return logits


class _InBatchSoftmaxCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over masked logits with a hand-written backward.

    Autograd through mm / div / sub / masked_fill / cross_entropy keeps one B_q x C tensor per op
    and makes ~8 passes over B_q x C; this keeps one (the log-probabilities, computed in place on
    the logits on CPU) and makes ~4: the GEMM, log_softmax, then in backward exp and the two GEMMs.
    Gradient: dL/dlogits = (softmax - onehot(label)) / B_q; dlogits/dq = c / tau, dlogits/dc = q / tau.
    """

    @staticmethod
    def forward(
        ctx, queries, candidates, labels, query_item_ids, candidate_item_ids, temperature, candidate_log_q, history
    ):
        logits = masked_logits(
            queries,
            candidates,
            labels=labels,
            query_item_ids=query_item_ids,
            candidate_item_ids=candidate_item_ids,
            temperature=temperature,
            candidate_log_q=candidate_log_q,
            history=history,
        )
        # in place on CPU (the kernel reads each row before writing it; a fresh 8192 x 8192 tensor
        # would page-fault in every step); out of place on other devices, where that is not verified
        log_probs = torch.log_softmax(logits, 1, out=logits) if _on_host(logits) else torch.log_softmax(logits, 1)
        rows = torch.arange(labels.numel(), device=labels.device)
        loss = -log_probs[rows, labels].mean()
        ctx.save_for_backward(queries, candidates, log_probs, labels)
        ctx.temperature = temperature
        ctx.matmul_dtype = matmul_dtype(queries.device)  # backward may run outside the autocast region
        ctx.backward_done = False
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.backward_done:
            raise RuntimeError("sampled_softmax_loss: backward ran twice (its buffer is reused in place)")
        ctx.backward_done = True
        queries, candidates, log_probs, labels = ctx.saved_tensors
        grad_logits = log_probs.exp_()  # the softmax, in place
        grad_logits[torch.arange(labels.numel(), device=labels.device), labels] -= 1.0
        scale = grad_loss / (labels.numel() * ctx.temperature)  # a 0-dim tensor: no host sync
        dtype = ctx.matmul_dtype
        with torch.autocast(grad_logits.device.type, enabled=False):
            if dtype is not None:  # the two GEMMs in the forward's dtype, the gradients handed back in fp32
                grad_logits, candidates, queries = grad_logits.to(dtype), candidates.to(dtype), queries.to(dtype)
            grad_q = torch.mm(grad_logits, candidates).float().mul_(scale) if ctx.needs_input_grad[0] else None
            grad_c = torch.mm(grad_logits.t(), queries).float().mul_(scale) if ctx.needs_input_grad[1] else None
        return grad_q, grad_c, None, None, None, None, None, None


class _BlockedInBatchSoftmaxCrossEntropy(torch.autograd.Function):
    """The dense form's loss and gradients, computed ``block_rows`` queries at a time, all in the forward.

    Per block: its masked logits (``masked_logits`` into one reused fp32 buffer on CPU), log_softmax in place,
    the labels' log-probabilities summed, then (when a gradient is wanted) softmax - onehot in place and the two
    gradient GEMMs: dq[block] = P c, dc += P^T q[block]. Backward multiplies the two saved gradients by the
    upstream one. Peak memory: one block_rows x C block plus the B_q x D and C x D gradients.
    """

    @staticmethod
    def forward(
        ctx,
        queries,
        candidates,
        labels,
        query_item_ids,
        candidate_item_ids,
        temperature,
        candidate_log_q,
        block_rows,
        history,
    ):
        num_queries, device = queries.shape[0], queries.device
        dtype = matmul_dtype(device)
        want_q, want_c = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # the GEMMs' operands converted once, not per block
        q_mm = queries if dtype is None else queries.to(dtype)
        c_mm = candidates if dtype is None else candidates.to(dtype)
        grad_q = torch.empty(queries.shape, dtype=torch.float32, device=device) if want_q else None
        grad_c = torch.zeros(candidates.shape, dtype=torch.float32, device=device) if want_c else None
        on_host = _on_host(queries)
        candidates_sorted = sorted_candidates(candidate_item_ids) if on_host else None
        buffer = None
        if on_host and dtype is None:  # a fresh block-sized tensor per block would page-fault on every block
            buffer = torch.empty(min(block_rows, num_queries), candidates.shape[0], dtype=torch.float32, device=device)
        label_log_prob = torch.zeros((), dtype=torch.float32, device=device)
        with torch.autocast(device.type, enabled=False):
            for lo in range(0, num_queries, block_rows):
                hi = min(lo + block_rows, num_queries)
                block_labels = labels[lo:hi]
                logits = masked_logits(
                    q_mm[lo:hi],
                    c_mm,
                    labels=block_labels,
                    query_item_ids=query_item_ids[lo:hi],
                    candidate_item_ids=candidate_item_ids,
                    temperature=temperature,
                    candidate_log_q=candidate_log_q,
                    candidates_sorted=candidates_sorted,
                    out=None if buffer is None else buffer[: hi - lo],
                    history=history,
                    first_row=lo,
                )
                rows = torch.arange(hi - lo, device=device)
                log_probs = torch.log_softmax(logits, 1, out=logits) if on_host else torch.log_softmax(logits, 1)
                label_log_prob += log_probs[rows, block_labels].sum()
                if want_q or want_c:
                    probs = log_probs.exp_()
                    probs[rows, block_labels] -= 1.0
                    _add_block_gradients(probs if dtype is None else probs.to(dtype), q_mm, c_mm, lo, grad_q, grad_c)
        scale = 1.0 / (num_queries * temperature)
        ctx.grads = (
            grad_q.mul_(scale) if grad_q is not None else None,
            grad_c.mul_(scale) if grad_c is not None else None,
        )
        return -label_log_prob / num_queries

    @staticmethod
    def backward(ctx, grad_loss):
        grad_q, grad_c = ctx.grads
        return (
            grad_q * grad_loss if grad_q is not None else None,
            grad_c * grad_loss if grad_c is not None else None,
            *([None] * 7),
        )


def _add_block_gradients(probs, q_mm, c_mm, lo, grad_q, grad_c) -> None:
    """A block's share of the two gradients (unscaled): dq[block] = P c, dc += P^T q[block] (None: not wanted)."""
    hi = lo + probs.shape[0]
    if grad_q is not None and probs.dtype == torch.float32 and c_mm.dtype == torch.float32:
        torch.mm(probs, c_mm, out=grad_q[lo:hi])
    elif grad_q is not None:
        grad_q[lo:hi] = torch.mm(probs, c_mm)
    if grad_c is not None:
        grad_c.add_(torch.mm(probs.t(), q_mm[lo:hi]))


# model.loss.block_mb=-1's budgets. CPU: blocks that stay near the caches ran faster than the dense form;
# GPU: fewer, larger blocks keep the kernel launches per step few (docs/performance.md, "The softmax in blocks")
AUTO_BLOCK_MB = {"cpu": 64, "cuda": 1024}


def resolve_block_mb(block_mb: int, device: torch.device) -> int:
    """model.loss.block_mb for ``device``: -1 -> ``AUTO_BLOCK_MB`` (a GPU's for any accelerator), else as given."""
    if block_mb != -1:
        return block_mb
    return AUTO_BLOCK_MB["cpu" if device.type == "cpu" else "cuda"]


def block_rows_for(num_queries: int, num_candidates: int, block_mb: float) -> int:
    """Queries per block so that one block's fp32 logits fit ``block_mb`` MiB (at least one row); ``num_queries``
    (one block: the dense form) when ``block_mb`` is 0 or the whole B_q x C fits."""
    if block_mb <= 0:
        return max(num_queries, 1)
    rows = int(block_mb * 2**20) // (4 * max(num_candidates, 1))
    return max(1, min(rows, num_queries))


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward(): an autograd Function inside
def sampled_softmax_loss(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    *,
    labels: torch.Tensor,
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    temperature: float,
    candidate_log_q: torch.Tensor | None = None,
    block_mb: float = 0.0,
    query_history: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of each query against all candidates (the scores of ``masked_logits``).

    queries ``B_q x D``; candidates ``C x D``; labels ``B_q`` (column of each positive);
    query_item_ids ``B_q``; candidate_item_ids ``C``; candidate_log_q ``C`` or None (no gradient
    flows to it). Gradients flow to queries and candidates; backward may run once.
    ``block_mb``: 0 computes the dense B_q x C logits; > 0 the row-blocked form whenever the whole does not
    fit in that many MiB of fp32 logits (the same loss and gradients to float rounding); -1 the device's budget
    (``resolve_block_mb``: resolved here, where the tensors are real, not fx proxies).
    ``query_history``: (lengths ``B_q``, items) of each query's history bag: those items' candidates are masked too
    (recsys/components/losses/candidate_hits.py).
    """
    if candidate_log_q is not None and candidate_log_q.requires_grad:
        raise ValueError("sampled_softmax_loss: candidate_log_q must not require grad")
    block_mb = resolve_block_mb(block_mb, queries.device)
    block_rows = block_rows_for(queries.shape[0], candidates.shape[0], block_mb)
    history = None if query_history is None else QueryHistory.of(*query_history, candidate_item_ids)
    args = (queries, candidates, labels, query_item_ids, candidate_item_ids, temperature, candidate_log_q)
    if block_rows < queries.shape[0]:
        return _BlockedInBatchSoftmaxCrossEntropy.apply(*args, block_rows, history)
    return _InBatchSoftmaxCrossEntropy.apply(*args, history)
