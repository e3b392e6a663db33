"""Training task: in-batch softmax with logQ correction, mixed negatives and accidental-hit masking.

Scores s(u, i) = <q(u), c(i)> / tau - log q(i) over the candidates of the whole global batch
(every rank's positives, gathered) plus ``num_uniform_negatives`` uniformly sampled items shared
by the batch. q(i) is the probability that item i appears as a candidate under that mixture:

    q(i) = (B * p(i) + B' / N) / (B + B')      p(i): training frequency of i, B: global batch,
                                               B': uniform negatives, N: number of items

A candidate with the same item as a query's positive (other than the positive itself) is masked.
The loss is the mean cross-entropy over this rank's queries; with gathered candidates and
torchrec / DDP averaging gradients over ranks, N ranks follow the same curve as one process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from recsys.data.batch import Batch
from recsys.model.two_tower import TwoTower


class LocalCandidates(nn.Module):
    """One process: the candidates are this rank's own. recsys.distributed swaps in a gather.

    forward(local candidates, global batch size, per-rank sizes or None) -> (candidates of every
    rank in rank order, offset of this rank's rows). A module, not a function, so that torch.fx (TrainPipelineSparseDist traces forward()
    to find the sparse inputs) treats it as a leaf instead of tracing into a collective.
    """

    world_size = 1

    def forward(
        self, t: torch.Tensor, global_size: int, sizes: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, int]:
        return t, 0


def accidental_hits(
    query_item_ids: torch.Tensor, candidate_item_ids: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of every candidate whose item is its query's positive, the label itself excepted.

    Found by sorting the candidates' ids, never as a B_q x C comparison, which is ~35x slower on CPU
    at large batches (docs/performance.md, "What changed for speed"). (On CUDA the pair
    count would need a host sync to size the result; ``sampled_softmax_loss`` uses the dense mask there.)
    """
    sorted_ids, order = torch.sort(candidate_item_ids)
    first = torch.searchsorted(sorted_ids, query_item_ids)
    counts = torch.searchsorted(sorted_ids, query_item_ids, right=True) - first
    rows = torch.repeat_interleave(torch.arange(query_item_ids.numel(), device=counts.device), counts)
    # position of each pair within its query's run of equal ids, then the candidate column there
    run_start = torch.cumsum(counts, 0) - counts
    cols = order[torch.repeat_interleave(first - run_start, counts) + torch.arange(rows.numel(), device=counts.device)]
    keep = cols != labels[rows]
    return rows[keep], cols[keep]


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
) -> torch.Tensor:
    """``B_q x C`` fp32 scores <q, c> / tau - log q(c), accidental hits set to -inf (no autograd).

    Under autocast (trainer.precision=bf16) only the GEMM runs in the autocast dtype (fp32 accumulation):
    the scores are fp32 before the bias, so the softmax never sees bf16's 3 significant digits.
    """
    with torch.no_grad():
        dtype = matmul_dtype(queries.device)
        if dtype is not None:
            with torch.autocast(queries.device.type, enabled=False):
                logits = torch.mm(queries.to(dtype), candidates.to(dtype).t()).float().mul_(1.0 / temperature)
            if candidate_log_q is not None:
                logits.sub_(candidate_log_q.unsqueeze(0))
        elif candidate_log_q is not None:
            # the logQ row is the GEMM's bias and 1/tau its alpha: no extra B_q x C pass for either
            logits = torch.addmm(candidate_log_q.neg().unsqueeze(0), queries, candidates.t(), alpha=1.0 / temperature)
        else:
            logits = torch.mm(queries, candidates.t()).mul_(1.0 / temperature)
        if _on_host(logits):
            logits.index_put_(accidental_hits(query_item_ids, candidate_item_ids, labels), torch.tensor(float("-inf")))
        else:
            hits = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)
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
    def forward(ctx, queries, candidates, labels, query_item_ids, candidate_item_ids, temperature, candidate_log_q):
        logits = masked_logits(
            queries,
            candidates,
            labels=labels,
            query_item_ids=query_item_ids,
            candidate_item_ids=candidate_item_ids,
            temperature=temperature,
            candidate_log_q=candidate_log_q,
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
        return grad_q, grad_c, None, None, None, None, None


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
) -> torch.Tensor:
    """Mean cross-entropy of each query against all candidates (the scores of ``masked_logits``).

    queries ``B_q x D``; candidates ``C x D``; labels ``B_q`` (column of each positive);
    query_item_ids ``B_q``; candidate_item_ids ``C``; candidate_log_q ``C`` or None (no gradient
    flows to it). Gradients flow to queries and candidates; backward may run once.
    """
    if candidate_log_q is not None and candidate_log_q.requires_grad:
        raise ValueError("sampled_softmax_loss: candidate_log_q must not require grad")
    return _InBatchSoftmaxCrossEntropy.apply(
        queries, candidates, labels, query_item_ids, candidate_item_ids, temperature, candidate_log_q
    )


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward()
def cosine_contrastive_loss(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    *,
    labels: torch.Tensor,
    query_item_ids: torch.Tensor,
    candidate_item_ids: torch.Tensor,
    margin: float,
    negative_weight: float,
) -> torch.Tensor:
    """SimpleX's cosine contrastive loss (Mao et al., CIKM 2021), mean over queries:

        (1 - cos(q, c+)) + negative_weight * mean_j max(0, cos(q, c_j) - margin)

    over every other candidate j (accidental hits excluded). Queries and candidates are unit-norm,
    so the dot product is the cosine; no temperature and no logQ: negatives below the margin cost
    nothing, which is what lets many easy negatives in without drowning the hard ones.
    """
    sims = torch.mm(queries, candidates.t()).float()  # fp32 past the GEMM under autocast (trainer.precision)
    rows = torch.arange(labels.numel(), device=labels.device)
    with torch.no_grad():
        excluded = candidate_item_ids.unsqueeze(0) == query_item_ids.unsqueeze(1)  # the positive and its hits
        excluded[rows, labels] = True
        num_negatives = (~excluded).sum(1).clamp_min(1)
    positive = sims[rows, labels]
    negative = torch.relu(sims - margin).masked_fill(excluded, 0.0).sum(1) / num_negatives
    return ((1.0 - positive) + negative_weight * negative).mean()


class RetrievalTask(nn.Module):
    def __init__(
        self,
        model: TwoTower,
        *,
        item_counts: torch.Tensor,
        temperature: float,
        logq_correction: bool,
        logq_weight: float = 1.0,
        num_uniform_negatives: int,
        loss: str = "softmax",
        margin: float = 0.9,
        negative_weight: float = 150.0,
    ) -> None:
        super().__init__()
        if loss not in ("softmax", "ccl"):
            raise ValueError(f"model.loss={loss!r}: expected 'softmax' or 'ccl'")
        self.loss, self.margin, self.negative_weight = loss, margin, negative_weight
        self.model = model
        self.temperature = temperature
        self.logq_correction = logq_correction
        self.logq_weight = logq_weight
        self.num_uniform_negatives = num_uniform_negatives
        counts = item_counts.to(torch.float64)
        self.register_buffer("item_probs", (counts / counts.sum()).to(torch.float32), persistent=False)
        self.gather_candidates: nn.Module = LocalCandidates()

    def candidate_log_q(self, item_ids: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        num_items = self.item_probs.numel()
        b, b_neg = global_batch_size, self.num_uniform_negatives
        q = (b * self.item_probs[item_ids] + b_neg / num_items) / (b + b_neg)
        return torch.log(q.clamp_min(1e-12))

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate, its detached copy: the output TrainPipelineSparseDist hands back)."""
        n = batch.num_queries
        queries, candidates = self.model(batch.features, n)
        global_n = batch.global_num_queries
        gathered = self.gather_candidates(candidates[:n], global_n, batch.rank_sizes)
        positives, offset = gathered[0], gathered[1]  # indexing, not unpacking: fx-traceable
        positive_ids = self.gather_candidates(batch.candidate_item_ids[:n], global_n, batch.rank_sizes)[0]
        all_candidates = torch.cat([positives, candidates[n:]])
        all_ids = torch.cat([positive_ids, batch.candidate_item_ids[n:]])
        labels = torch.arange(offset, offset + n, device=queries.device)
        if self.loss == "ccl":
            loss = cosine_contrastive_loss(
                queries,
                all_candidates,
                labels=labels,
                query_item_ids=batch.candidate_item_ids[:n],
                candidate_item_ids=all_ids,
                margin=self.margin,
                negative_weight=self.negative_weight,
            )
        else:
            log_q = self.candidate_log_q(all_ids, positives.shape[0]) if self.logq_correction else None
            if log_q is not None and self.logq_weight != 1.0:
                log_q = log_q * self.logq_weight
            loss = sampled_softmax_loss(
                queries,
                all_candidates,
                labels=labels,
                query_item_ids=batch.candidate_item_ids[:n],
                candidate_item_ids=all_ids,
                temperature=self.temperature,
                candidate_log_q=log_q,
            )
        # Mean over this rank's queries, reweighted so that the ranks' average (what DDP and
        # torchrec's gradient division take) is the mean over the global batch, also when the
        # shares differ by a row: loss_r * n_r * W / N.
        loss = loss * (n * self.gather_candidates.world_size / global_n)
        return loss, loss.detach()
