"""The uniformity of a set of unit vectors (Wang & Isola, ICML 2020; DirectAU, Wang et al., KDD 2022):

    log mean_{i != j} exp(-t * ||x_i - x_j||^2)

lowest (about -2t for many vectors in high dimension) when the vectors spread evenly over the sphere. A loss adds it,
weighted, so that queries and items do not crowd into a few directions (recsys/components/losses/softmax.py's
``uniformity_weight``). Not a component: it has no ``Config``.
"""

from __future__ import annotations

import math

import torch


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward()
def uniformity(vectors: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """The formula above over the rows of ``vectors`` (N x D, unit-norm, N >= 2), from their Gram matrix: for unit
    vectors ||x_i - x_j||^2 = 2 - 2 <x_i, x_j>. One N x N product (2 N^2 D FLOPs)."""
    n = vectors.shape[0]
    if n < 2:
        return vectors.new_zeros(())
    gram = torch.mm(vectors, vectors.t()).float()  # fp32 past the GEMM under autocast
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=vectors.device)
    exponents = (-t * (2.0 - 2.0 * gram))[off_diagonal]
    return torch.logsumexp(exponents, dim=0) - math.log(n * (n - 1))
