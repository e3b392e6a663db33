"""Synthetic interactions with planted structure: the default dataset, no download needed.

    $ python -c "from data_pipelines.synthetic import *; print(prepare_synthetic(TINY_SPEC, root='data'))"

Generative story (all draws from ``numpy.random.default_rng`` streams spawned from ``spec.seed``):

1. Factors. U [num_users, D] and V [num_items, D] with i.i.d. N(0, 1/sqrt(D)) entries, so
   the affinity U_u . V_i has variance ~1 whatever D is.
2. Popularity. A random permutation ranks the items; the item of rank r (0-based) gets
   ``popularity_bias = -popularity_exponent * log(r + 1)`` (a Zipf weight ``(r+1)^-a``).
3. Categories. Centroids C [num_categories, D] ~ N(0, 1/sqrt(D)). An item's primary category
   is ``argmax_c V_i . C_c``; it gets ``Binomial(max_extra_categories, extra_category_prob)``
   more, sampled without replacement from ``softmax(V_i . C / category_temperature)`` over
   the other categories. Stored sorted, no duplicates.
4. Activity. Per-user weight ~ LogNormal(0, activity_sigma); counts start at
   ``min_interactions_per_user`` and the rest of ``num_interactions`` is handed out in
   proportion to the weights (largest remainders, capped at ``num_items // 2``), so the total
   is EXACTLY ``num_interactions``.
5. Items. User u draws its n_u items WITHOUT replacement with probability proportional to
   ``exp(U_u . V_i / temperature + popularity_bias_i)``: Gumbel-top-k, vectorized over
   chunks of users with similar n_u.
6. Time. The user's taste drifts along a random unit direction w_u: their items are ordered
   by ``V_i . w_u * D^(1/4) + drift_noise * N(0, 1)`` (a planted sequential signal), the first
   at a uniform time in ``[start_timestamp, start_timestamp + time_span_seconds)``, then
   gaps of ``1 + Exponential(mean_gap_seconds)`` seconds (strictly increasing, int seconds).
7. Ratings. ``U_u . V_i + N(0, rating_noise^2)`` cut at the quantiles of ML-1M's star shares
   (``RATING_SHARES``) into 1..5, float32: higher affinity, higher rating.
8. User groups (``num_user_groups > 0`` only; its own stream, so nothing above changes). Directions
   G [num_user_groups, D] ~ N(0, 1/sqrt(D)); user u's ``user_group`` is ``argmax_g U_u . G_g``: a
   categorical user attribute that tells part of the user's taste (a side feature for ``model.features``),
   declared in meta.json ``user_features``.
9. Item churn (``churn_periods > 0`` only; its own stream, so without it nothing above changes). The time span is
   cut into ``churn_periods`` equal periods and item i is on offer in periods ``[b_i, b_i + item_lifetime_periods)``,
   ``b_i`` uniform over the periods that let it overlap the span (so each period has new items and loses old
   ones). Users are active over the whole span: a user's n_u interactions get times uniform over it, and the
   rows falling in period p draw (step 5's Gumbel-top-k, without replacement, never an item the user has already)
   among the items on offer in p, in step 6's taste-drift order within the period. A row that finds no item left
   is dropped, so the total is at most ``num_interactions``. What a continuous-training replay needs: the ids
   of tomorrow's log are partly new, and yesterday's partly gone (docs/continuous-training.md).

With the defaults, an oracle ranking by the true logit has several times the Recall@20 of a
popularity ranking, and popularity is itself far above random (tests/data_pipelines/test_synthetic.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from data_pipelines.config import SyntheticDataConfig
from data_pipelines.dataset_dir import CODE_VERSION, is_prepared
from data_pipelines.dataset_writer import write_dataset_dir
from data_pipelines.splits import PROTOCOLS, split

__all__ = [
    "DEFAULT_SPEC",
    "TINY_SPEC",
    "SyntheticFactors",
    "SyntheticSpec",
    "cache_key",
    "generate",
    "prepare_synthetic",
]

RATING_SHARES = (0.056, 0.108, 0.261, 0.349, 0.226)  # share of 1..5 stars in MovieLens-1M
_CHUNK_ELEMENTS = 1 << 21  # users x items logits per sampling chunk (8 MiB of float32)


@dataclass(frozen=True)
class SyntheticSpec:
    """Everything that determines a synthetic dataset (the cache key hashes all of it)."""

    num_users: int  # users; ids 0..num_users-1
    num_items: int  # items; ids 0..num_items-1
    num_categories: int  # categories; ids 0..num_categories-1
    num_interactions: int  # rows over train+valid+test, exact
    latent_dim: int = 16  # D, dimension of the true user / item factors
    temperature: float = 0.25  # divides U.V (variance ~1) in the sampling logit; lower = stronger taste signal
    popularity_exponent: float = 1.0  # Zipf exponent a: rank-r item weight (r+1)^-a; 0 disables popularity
    activity_sigma: float = 1.0  # sigma of the lognormal user activity; 0 = every user equally active
    min_interactions_per_user: int = 5  # floor on a user's count (the cap is num_items // 2)
    max_extra_categories: int = 2  # categories per item = 1 primary + Binomial(this, extra_category_prob)
    extra_category_prob: float = 0.33  # 0.33 -> ~1.66 categories per item, like ML-1M's genres
    category_temperature: float = 0.5  # softmax temperature over V_i.C for extra categories
    drift_noise: float = 1.0  # noise on the taste-drift order (unit: std of V_i.w_u); large = no sequence signal
    rating_noise: float = 0.5  # std of the noise added to U_u.V_i before it is cut into stars
    start_timestamp: int = 956_703_932  # seconds since epoch; ML-1M's first rating, 2000-04-25
    time_span_seconds: int = 3 * 365 * 86_400  # users' first interactions are uniform over this span
    mean_gap_seconds: int = 3_600  # mean gap between one user's consecutive interactions
    seed: int = 0  # seeds every random draw of the generator
    num_user_groups: int = 0  # users.parquet user_group: argmax_g U_u . G_g over this many directions; 0 = none
    churn_periods: int = 0  # item churn (step 9): periods of the time span; 0 = every item on offer all the time
    item_lifetime_periods: int = 2  # with churn_periods > 0: consecutive periods each item is on offer

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "num_categories", "num_interactions", "latent_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SyntheticSpec.{name} must be positive, got {getattr(self, name)}")
        cap = self.num_items // 2
        if not 1 <= self.min_interactions_per_user <= cap:
            raise ValueError(
                f"SyntheticSpec.min_interactions_per_user={self.min_interactions_per_user} must be in [1, num_items // 2 = {cap}]"
            )
        lo, hi = self.num_users * self.min_interactions_per_user, self.num_users * cap
        if not lo <= self.num_interactions <= hi:
            raise ValueError(
                f"SyntheticSpec.num_interactions={self.num_interactions} must be in [{lo}, {hi}] "
                f"(num_users x min_interactions_per_user .. num_users x num_items // 2)"
            )
        if self.temperature <= 0 or self.category_temperature <= 0:
            raise ValueError("SyntheticSpec temperatures must be positive")
        if self.num_user_groups < 0:
            raise ValueError(f"SyntheticSpec.num_user_groups must be >= 0 (0 = none), got {self.num_user_groups}")
        if self.churn_periods < 0 or (self.churn_periods and self.item_lifetime_periods < 1):
            raise ValueError(
                f"SyntheticSpec.churn_periods={self.churn_periods} must be >= 0 (0 = no churn) and "
                f"item_lifetime_periods={self.item_lifetime_periods} >= 1"
            )


def spec_dict(spec: SyntheticSpec) -> dict:
    """The spec as the cache key hashes it: without num_user_groups when 0, so that datasets prepared
    before it existed keep their cache keys (and dir names)."""
    out = dataclasses.asdict(spec)
    if not out["num_user_groups"]:
        del out["num_user_groups"]
    if not out["churn_periods"]:  # likewise without churn (its lifetime is unused then)
        del out["churn_periods"], out["item_lifetime_periods"]
    return out


# Shaped like MovieLens-1M (6040 users, 3706 rated movies, 18 genres, 1,000,209 ratings, >= 20 each).
DEFAULT_SPEC = SyntheticSpec(**asdict(SyntheticDataConfig()))  # its numbers are data.synthetic's defaults
# For unit and end-to-end tests: generates in well under a second.
TINY_SPEC = SyntheticSpec(num_users=400, num_items=300, num_categories=8, num_interactions=20_000, seed=0)


@dataclass(frozen=True)
class SyntheticFactors:
    """The hidden truth behind a generated dataset (for oracles and tests)."""

    user_factors: np.ndarray  # U [num_users, D] float64
    item_factors: np.ndarray  # V [num_items, D] float64
    popularity_bias: np.ndarray  # [num_items] float64, added to the logit
    category_centroids: np.ndarray  # C [num_categories, D] float64
    temperature: float

    def logits(self, user_ids: np.ndarray | None = None) -> np.ndarray:
        """True sampling logits U_u.V_i / temperature + popularity_bias_i: [len(user_ids), num_items]."""
        u = self.user_factors if user_ids is None else self.user_factors[user_ids]
        return u @ self.item_factors.T / self.temperature + self.popularity_bias


def _gumbel(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    u = rng.random(shape, dtype=np.float32)
    return -np.log(-np.log(np.maximum(u, np.float32(1e-30))))


def _user_counts(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """Per-user interaction counts [num_users] int64, summing exactly to num_interactions."""
    cap = spec.num_items // 2
    weights = (
        rng.lognormal(0.0, spec.activity_sigma, spec.num_users) if spec.activity_sigma > 0 else np.ones(spec.num_users)
    )
    counts = np.full(spec.num_users, spec.min_interactions_per_user, dtype=np.int64)
    remaining = spec.num_interactions - int(counts.sum())
    while remaining > 0:  # each pass fills or caps users; a handful of passes
        free = np.flatnonzero(counts < cap)
        share = remaining * weights[free] / weights[free].sum()
        add = np.minimum(np.floor(share).astype(np.int64), cap - counts[free])
        if add.sum() == 0:  # every share < 1: largest remainders get one more (sum of shares = remaining)
            order = np.argsort(-(share - np.floor(share)), kind="stable")[:remaining]
            add = np.zeros_like(add)
            add[order] = 1
        counts[free] += add
        remaining -= int(add.sum())
    return counts


def _categories(spec: SyntheticSpec, V: np.ndarray, C: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    affinity = V @ C.T  # [I, C]
    primary = affinity.argmax(axis=1)
    max_extra = min(spec.max_extra_categories, spec.num_categories - 1)
    n_extra = (
        rng.binomial(max_extra, spec.extra_category_prob, spec.num_items)
        if max_extra > 0
        else np.zeros(spec.num_items, np.int64)
    )
    keys = affinity / spec.category_temperature + _gumbel(rng, affinity.shape)
    keys[np.arange(spec.num_items), primary] = -np.inf
    extras = np.argsort(-keys, axis=1, kind="stable")[:, :max_extra]  # Gumbel-top-k = softmax w/o replacement
    return [np.sort(np.r_[primary[i], extras[i, : n_extra[i]]]).astype(np.int64) for i in range(spec.num_items)]


def _sample_items(
    spec: SyntheticSpec, U: np.ndarray, V: np.ndarray, bias: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(user_ids, item_ids) with counts[u] distinct items per user, by Gumbel-top-k."""
    Uf, Vt, biasf = U.astype(np.float32), V.T.astype(np.float32), bias.astype(np.float32)
    by_count = np.argsort(counts, kind="stable")  # similar counts share a chunk: little wasted top-k
    chunk = max(1, _CHUNK_ELEMENTS // spec.num_items)
    user_parts, item_parts = [], []
    for start in range(0, spec.num_users, chunk):
        users = by_count[start : start + chunk]
        k = counts[users]
        k_max = int(k.max())
        keys = (Uf[users] @ Vt) / np.float32(spec.temperature) + biasf + _gumbel(rng, (len(users), spec.num_items))
        top = np.argpartition(-keys, k_max - 1, axis=1)[:, :k_max]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1, kind="stable"), axis=1)
        keep = np.arange(k_max) < k[:, None]
        user_parts.append(np.repeat(users, k))
        item_parts.append(top[keep])
    return np.concatenate(user_parts).astype(np.int64), np.concatenate(item_parts).astype(np.int64)


def generate(
    spec: SyntheticSpec, *, return_factors: bool = False
) -> (
    tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, SyntheticFactors]
):
    """Generate ``(interactions, items, users)`` (+ the true factors if ``return_factors``).

    interactions: num_interactions rows, columns user_id int64, item_id int64, timestamp int64
                  (s), rating float32 in {1..5}; sorted by (user_id, timestamp, item_id); no
                  (user_id, item_id) pair twice.
    items:        item_id int64 0..num_items-1, categories (int64 arrays, sorted, 1..1+max_extra)
    users:        user_id int64 0..num_users-1 (+ user_group int64 0..num_user_groups-1 when asked for)
    """
    D = spec.latent_dim
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(7)]
    r_factors, r_popularity, r_categories, r_activity, r_items, r_time, r_rating = streams

    scale = D**-0.25  # entries N(0, 1/sqrt(D)) -> U_u.V_i has variance ~1
    U = r_factors.normal(0.0, scale, (spec.num_users, D))
    V = r_factors.normal(0.0, scale, (spec.num_items, D))
    C = r_factors.normal(0.0, scale, (spec.num_categories, D))
    bias = np.empty(spec.num_items)
    bias[r_popularity.permutation(spec.num_items)] = -spec.popularity_exponent * np.log1p(np.arange(spec.num_items))

    categories = _categories(spec, V, C, r_categories)
    counts = _user_counts(spec, r_activity)
    if spec.churn_periods:  # step 9: its own stream and its own sampling and times
        interactions = _churn_interactions(spec, U, V, bias, counts, np.random.default_rng([spec.seed, 9]))
        return _finish(spec, interactions, U, V, bias, C, categories, r_rating, return_factors)
    user_ids, item_ids = _sample_items(spec, U, V, bias, counts, r_items)

    # Order each user's items by their drifting taste, then lay them out in time.
    drift = r_time.normal(size=(spec.num_users, D))
    drift /= np.linalg.norm(drift, axis=1, keepdims=True)
    progress = np.einsum("nd,nd->n", V[item_ids], drift[user_ids]) * D**0.25
    progress += spec.drift_noise * r_time.normal(size=len(item_ids))
    order = np.lexsort((progress, user_ids))
    user_ids, item_ids = user_ids[order], item_ids[order]
    gaps = 1 + np.floor(r_time.exponential(spec.mean_gap_seconds, len(item_ids))).astype(np.int64)
    first_row = np.r_[0, np.cumsum(np.bincount(user_ids, minlength=spec.num_users))[:-1]]
    elapsed = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first_row], counts)  # 0 at each user's first row
    user_start = spec.start_timestamp + r_time.integers(0, spec.time_span_seconds, spec.num_users)
    timestamps = user_start[user_ids] + elapsed

    interactions = pd.DataFrame({"user_id": user_ids, "item_id": item_ids, "timestamp": timestamps})
    return _finish(spec, interactions, U, V, bias, C, categories, r_rating, return_factors)


def _finish(spec, interactions, U, V, bias, C, categories, r_rating, return_factors):
    """Step 7 (ratings) on the (user_id, item_id, timestamp) rows, then the items and users tables (step 8)."""
    D = spec.latent_dim
    scale = D**-0.25
    user_ids, item_ids = interactions["user_id"].to_numpy(), interactions["item_id"].to_numpy()
    affinity = np.einsum("nd,nd->n", U[user_ids], V[item_ids]) + r_rating.normal(0.0, spec.rating_noise, len(item_ids))
    cuts = np.quantile(affinity, np.cumsum(RATING_SHARES)[:-1])
    interactions["rating"] = (1 + np.searchsorted(cuts, affinity, side="right")).astype(np.float32)
    items = pd.DataFrame({"item_id": np.arange(spec.num_items, dtype=np.int64), "categories": categories})
    users = pd.DataFrame({"user_id": np.arange(spec.num_users, dtype=np.int64)})
    if spec.num_user_groups:
        G = np.random.default_rng([spec.seed, 8]).normal(0.0, scale, (spec.num_user_groups, D))
        users["user_group"] = np.argmax(U @ G.T, axis=1).astype(np.int64)
    if return_factors:
        return interactions, items, users, SyntheticFactors(U, V, bias, C, spec.temperature)
    return interactions, items, users


def _churn_interactions(
    spec: SyntheticSpec, U: np.ndarray, V: np.ndarray, bias: np.ndarray, counts: np.ndarray, rng: np.random.Generator
) -> pd.DataFrame:
    """Step 9: rows (user_id, item_id, timestamp), sorted by (user_id, timestamp), with items on offer at their time."""
    P, L, D = spec.churn_periods, spec.item_lifetime_periods, spec.latent_dim
    birth = rng.integers(-(L - 1), P, spec.num_items)  # on offer in periods [birth, birth + L)
    user_ids = np.repeat(np.arange(spec.num_users, dtype=np.int64), counts)
    offsets = rng.integers(0, spec.time_span_seconds, len(user_ids))
    period = offsets * P // spec.time_span_seconds
    drift = rng.normal(size=(spec.num_users, D))
    drift /= np.linalg.norm(drift, axis=1, keepdims=True)
    taken = np.zeros((spec.num_users, spec.num_items), dtype=bool)  # no (user, item) pair twice
    item_ids = np.full(len(user_ids), -1, dtype=np.int64)
    Vt, biasf = V.T.astype(np.float32), bias.astype(np.float32)
    for p in range(P):
        on_offer = (birth <= p) & (p < birth + L)
        rows = np.flatnonzero(period == p)
        users, first = np.unique(user_ids[rows], return_index=True)
        wanted = np.diff(np.append(first, len(rows)))  # rows of each user in this period
        chunk = max(1, _CHUNK_ELEMENTS // spec.num_items)
        for lo in range(0, len(users), chunk):
            us, k = users[lo : lo + chunk], wanted[lo : lo + chunk]
            keys = (U[us].astype(np.float32) @ Vt) / np.float32(spec.temperature) + biasf
            keys += _gumbel(rng, keys.shape)
            keys[:, ~on_offer] = -np.inf
            keys[taken[us]] = -np.inf
            top = np.argsort(-keys, axis=1, kind="stable")[:, : int(k.max())]
            ok = (np.arange(top.shape[1]) < k[:, None]) & np.isfinite(np.take_along_axis(keys, top, axis=1))
            # within the period, the user's items in taste-drift order (step 6), laid on the period's sorted times
            progress = np.einsum("nkd,nd->nk", V[top], drift[us]) * D**0.25
            progress += spec.drift_noise * rng.normal(size=progress.shape)
            order = np.argsort(np.where(ok, progress, np.inf), axis=1, kind="stable")
            top, ok = np.take_along_axis(top, order, axis=1), np.take_along_axis(ok, order, axis=1)
            taken[np.repeat(us, ok.sum(1)), top[ok]] = True
            for j in range(len(us)):  # the user's rows of the period, in time order
                mine = rows[first[lo + j] : first[lo + j] + k[j]]
                mine = mine[np.argsort(offsets[mine], kind="stable")]
                got = top[j][ok[j]]
                item_ids[mine[: len(got)]] = got
    kept = item_ids >= 0
    frame = pd.DataFrame(
        {"user_id": user_ids[kept], "item_id": item_ids[kept], "timestamp": spec.start_timestamp + offsets[kept]}
    )
    return frame.sort_values(["user_id", "timestamp", "item_id"], kind="stable", ignore_index=True)


def cache_key(spec: SyntheticSpec, protocol: str, seed: int) -> str:
    """16 hex chars of sha256 over the canonical JSON of (spec, protocol, split seed, code version)."""
    payload = {"spec": spec_dict(spec), "protocol": protocol, "seed": seed, "code_version": CODE_VERSION}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare_synthetic(
    spec: SyntheticSpec, *, protocol: str = "recbole", split_seed: int = 0, root: str | os.PathLike
) -> Path:
    """Generate, split and write ``<root>/synthetic-<cache_key>``; returns its absolute path.

    Idempotent: when that dir is complete and its meta.json carries the same cache key it is
    returned as is, without regenerating or rewriting anything.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown split protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
    key = cache_key(spec, protocol, split_seed)
    out_dir = (Path(root) / f"synthetic-{key}").absolute()
    if is_prepared(out_dir, key):
        return out_dir
    interactions, items, users = generate(spec)
    train, valid, test = split(interactions, protocol, seed=split_seed)
    meta = {
        "name": "synthetic",
        "protocol": protocol,
        "seed": split_seed,
        "num_users": spec.num_users,
        "num_items": spec.num_items,
        "num_categories": spec.num_categories,
        "sources": [],
        "spec": dataclasses.asdict(spec),
        "code_version": CODE_VERSION,
        "cache_key": key,
    }
    if spec.num_user_groups:
        meta["user_features"] = {"user_group": spec.num_user_groups}  # table rows for model.features
    return write_dataset_dir(out_dir, train=train, valid=valid, test=test, items=items, users=users, meta=meta)
