"""The offline evaluation report: the two-tower beside popularity, EASE and iALS, breakdowns, ANN, files.

The entry point embeds users and items (on any number of ranks), assembles an ``EvalInputs`` on
rank 0 and calls ``evaluate_and_report``; everything below is plain arrays, no process group.

Written into ``<run_dir>/eval/``, each file via a temporary file renamed into place:

    report.json              every number: metrics per split x model at every K, recall-vs-K curves,
                             breakdowns, EASE λ search and memory plan, iALS grid search,
                             ANN recall + latency, protocol, counts
    report.md                the same as readable tables, the protocol, the gap sentences
    recall_at_k.png          Recall@K for K = 1..max(ks), one panel per split, one line per model
    recommendations.parquet  the two-tower's top-K per user of one split (raw ids / titles when
                             the dataset dir has vocab/users.parquet, vocab/items.parquet, titles)
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from recsys.evaluation.ann import ANN_KINDS, AnnParams, compare_ann
from recsys.evaluation.breakdowns import ACTIVITY_EDGES, breakdowns
from recsys.evaluation.ease import (
    DEFAULT_LAMBDAS, MAX_EASE_ITEMS, USABLE_MEMORY_SHARE, EasePlan, available_memory_bytes, ease_from_gram, ease_peak_bytes,
    ease_topk, gram_dtype, gram_matrix, plan_ease, tune_ease,
)  # fmt: skip
from recsys.evaluation.ials import (
    DEFAULT_ALPHAS, DEFAULT_FACTORS, DEFAULT_ITERATIONS, DEFAULT_REGULARIZATIONS, ials_topk, tune_ials,
)  # fmt: skip
from recsys.evaluation.interactions import UserItemCSR
from recsys.evaluation.metrics import compute_metrics, hit_matrix
from recsys.evaluation.retrieval import exact_topk, popularity_topk

log = logging.getLogger(__name__)  # one line per stage: the report takes ~40 s on the default run

MODEL_LABELS = {"popularity": "popularity", "ease": "EASE", "ials": "iALS"}
EVAL_DIR = "eval"


@dataclass
class SplitInputs:
    """One evaluated split, rows in the order of ``users``.

    Attributes:
        users: int64 [U], user ids (rows of ``EvalInputs.train``) of the evaluated users.
        user_emb: [U, D] query embeddings of those users (history = the masked splits).
        relevant: [U rows, I] CSR, each user's held-out items of this split.
        exclude: [U rows, I] CSR, items never recommended (the user's items in ``masked_splits``);
            also EASE's input row x_u.
        masked_splits: names of the splits whose items are masked, e.g. ("train",) for valid,
            ("train", "valid") for test.
        sample: how ``users`` were sampled from the split, in words; "" = every user of the split.
    """

    users: np.ndarray
    user_emb: np.ndarray | torch.Tensor
    relevant: UserItemCSR
    exclude: UserItemCSR
    masked_splits: tuple[str, ...]
    sample: str = ""


@dataclass
class EvalInputs:
    """Everything the report needs; the entry point only assembles it.

    Attributes:
        item_emb: [I, D] candidate embeddings of every item, row = item id.
        splits: split name -> ``SplitInputs`` ("valid" is needed to tune EASE and iALS; usually "test").
        train: [num_users rows, I] CSR of the training interactions (EASE's X, activity counts).
        ks: cut-offs, e.g. [10, 20, 50, 100].
        item_train_counts: [I] training interactions per item (popularity scores and buckets);
            None: distinct training users per item, from ``train``.
        dataset_dir: the dataset dir (meta.json counts, vocab/*.parquet raw ids, titles); optional.
        checkpoint: path of the checkpoint that was evaluated, recorded verbatim.
        model_name: the label of the evaluated model in tables and plots.
        extra: anything else to record under ``report.json["run"]`` (config, world size, ...).
    """

    item_emb: np.ndarray | torch.Tensor
    splits: dict[str, SplitInputs]
    train: UserItemCSR
    ks: Sequence[int]
    item_train_counts: np.ndarray | None = None
    dataset_dir: str | Path | None = None
    checkpoint: str = ""
    model_name: str = "two_tower"
    extra: dict = field(default_factory=dict)


@dataclass
class ReportOptions:
    """What to compute beyond the model's own metrics.

    Attributes:
        ease: fit EASE (needs a "valid" split, num_items <= ``ease_max_items`` and the memory of
            ``ease.plan_ease``: float64 where it fits, else float32, else skipped with the reason).
        ease_lambdas: λ grid; the best validation recall@``ease_tune_k`` wins.
        ease_tune_k: cut-off of the tuning metric (20); also iALS's.
        ease_tune_users: validation users sampled for tuning (None: all); also iALS's.
        ease_max_items: above this, EASE is skipped with the reason recorded.
        ease_available_bytes: memory EASE may plan with; None = measured when the report runs
            (free memory of the CUDA device, else MemAvailable).
        ials: fit iALS (the ``implicit`` library; needs a "valid" split).
        ials_regularizations, ials_alphas: iALS's grid (their product); best validation
            recall@``ease_tune_k`` wins.
        ials_factors, ials_iterations: fixed D and ALS sweeps.
        ann_kinds: FAISS indexes to compare with exact search; empty disables ANN.
        ann_params: their settings.
        ann_split: split whose users are searched ("test", else the last split given).
        recommend_split: split whose top-K goes to recommendations.parquet ("test", else the last).
        recommend_k: rows per user in the parquet (None: max(ks)).
        headline_k: K of the gap sentences and breakdown tables (20; max(ks) if 20 is not in ks).
        num_seed_items / num_similar_items: "more like this": the most popular items and how many
            nearest items (cosine of item embeddings) each.
        chunk_size: query rows per score matrix chunk (memory ~ chunk_size x I x 4 bytes).
        device: torch device for exact scoring, EASE (when it fits there) and iALS's scoring.
        activity_edges, head_share, tail_share: bucket definitions (``breakdowns`` module).
        seed: sampling seed (EASE / iALS tuning users, iALS's initial factors, latency sample).
    """

    ease: bool = True
    ease_lambdas: Sequence[float] = DEFAULT_LAMBDAS
    ease_tune_k: int = 20
    ease_tune_users: int | None = 10_000
    ease_max_items: int = MAX_EASE_ITEMS
    ease_available_bytes: int | None = None
    ials: bool = True
    ials_regularizations: Sequence[float] = DEFAULT_REGULARIZATIONS
    ials_alphas: Sequence[float] = DEFAULT_ALPHAS
    ials_factors: int = DEFAULT_FACTORS
    ials_iterations: int = DEFAULT_ITERATIONS
    ann_kinds: Sequence[str] = ANN_KINDS
    ann_params: AnnParams = field(default_factory=AnnParams)
    ann_split: str = "test"
    recommend_split: str = "test"
    recommend_k: int | None = None
    headline_k: int = 20
    num_seed_items: int = 5
    num_similar_items: int = 10
    chunk_size: int = 4096
    device: str = "cpu"
    activity_edges: Sequence[int] = ACTIVITY_EDGES
    head_share: float = 0.2
    tail_share: float = 0.5
    seed: int = 0


@dataclass
class EvalReport:
    """``compute_report``'s result: the JSON-able report, the recommendations table, the curves."""

    report: dict
    recommendations: pd.DataFrame
    curves: dict[str, dict[str, np.ndarray]]  # split -> model -> recall@K for K = 1..max(ks)


# ------------------------------------------------------------------------------- inputs helpers


def _tensor(x: np.ndarray | torch.Tensor, device: str) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
    return t.detach().to(device=device, dtype=torch.float32)


def recall_curve(topk_ids: np.ndarray, relevant: UserItemCSR) -> np.ndarray:
    """Recall@K for K = 1..Kmax, float64 [Kmax], averaged over users with >= 1 relevant item."""
    num_relevant = relevant.lengths()
    evaluated = num_relevant > 0
    hits = hit_matrix(topk_ids, relevant)[evaluated]
    if not evaluated.any():
        return np.full(topk_ids.shape[1], np.nan)
    return (np.cumsum(hits, axis=1) / num_relevant[evaluated, None]).mean(axis=0)


def _read_parquet(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def _by_id(df: pd.DataFrame, id_col: str, value_col: str, n: int) -> np.ndarray | None:
    """``out[id] = value`` over ids [0, n), or None if the columns are missing or do not cover every id."""
    if df is None or id_col not in df.columns or value_col not in df.columns:
        return None
    ids = df[id_col].to_numpy()
    if ids.size == 0 or ids.min() < 0 or ids.max() >= n:
        return None
    out = np.full(n, None, dtype=object)
    out[ids] = df[value_col].to_numpy()
    return out


@dataclass
class _Names:
    user_raw: np.ndarray | None  # object [num_users] or None
    item_raw: np.ndarray | None  # object [I] or None
    titles: np.ndarray | None  # object [I] or None
    meta: dict


def _load_names(dataset_dir: str | Path | None, num_users: int, num_items: int) -> _Names:
    if dataset_dir is None:
        return _Names(None, None, None, {})
    root = Path(dataset_dir)
    meta_path = root / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    users_vocab = _read_parquet(root / "vocab" / "users.parquet")
    items_vocab = _read_parquet(root / "vocab" / "items.parquet")
    titles = _by_id(items_vocab, "item_id", "title", num_items)
    if titles is None:
        titles = _by_id(_read_parquet(root / "items.parquet"), "item_id", "title", num_items)
    return _Names(
        user_raw=_by_id(users_vocab, "user_id", "raw_id", num_users),
        item_raw=_by_id(items_vocab, "item_id", "raw_id", num_items),
        titles=titles,
        meta=meta,
    )


def _item_label(i: int, names: _Names) -> str:
    if names.titles is not None and names.titles[i] is not None:
        return str(names.titles[i])
    if names.item_raw is not None and names.item_raw[i] is not None:
        return f"item {names.item_raw[i]}"
    return f"item {i}"


def describe_protocol(inputs: EvalInputs) -> dict:
    """The protocol as data plus one plain sentence per split (what is ranked, what is masked)."""
    num_items = int(inputs.train.num_items)
    lines = {}
    for name, split in inputs.splits.items():
        masked = " and ".join(split.masked_splits) if split.masked_splits else "no"
        lines[name] = (
            f"{name}: full ranking over all {num_items} items for each of {split.relevant.num_users} users; "
            f"each user's {masked} items are masked (never recommended); the held-out {name} items are relevant."
            + (f" The users are {split.sample}." if split.sample else "")
        )
    return {
        "ranking": "full",
        "num_candidates": num_items,
        "masked_splits": {n: list(s.masked_splits) for n, s in inputs.splits.items()},
        "user_samples": {n: s.sample for n, s in inputs.splits.items() if s.sample},
        "ties": "equal scores are ordered by lower item id",
        "users": "users with no held-out item in the split are left out of every mean",
        "recall": "hits@K / |relevant|; recall_liang = hits@K / min(K, |relevant|) (Liang et al. 2018)",
        "ndcg": "binary gain, DCG = sum hit_j / log2(j + 2), IDCG over min(K, |relevant|) items",
        "sentences": lines,
    }


# ------------------------------------------------------------------------------- compute


def compute_report(inputs: EvalInputs, options: ReportOptions = ReportOptions()) -> EvalReport:
    """Ranks every split with the model, popularity, EASE (when it fits) and iALS, and measures everything.

    Returns an ``EvalReport``; nothing is written (``write_report`` does that).
    """
    ks = sorted({int(k) for k in inputs.ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive cut-offs, got {list(inputs.ks)}")
    kmax = max(ks)
    headline_k = options.headline_k if options.headline_k in ks else kmax
    device = options.device
    num_items = int(inputs.train.num_items)
    items = _tensor(inputs.item_emb, device)
    if items.shape[0] != num_items:
        raise ValueError(f"item_emb has {items.shape[0]} rows, train has {num_items} items")
    item_counts = (
        np.bincount(inputs.train.indices, minlength=num_items)
        if inputs.item_train_counts is None
        else np.asarray(inputs.item_train_counts)
    )
    user_train_items = inputs.train.lengths()
    model = inputs.model_name

    # EASE: a memory plan, λ on valid, then one B for every split.
    ease_b, ease_info = None, _ease_skip_reason(inputs, options, num_items)
    if ease_info is None:
        ease_device, plan = _plan_ease(inputs.train, options)
        if plan.dtype is None:
            ease_info = {"skipped": plan.skipped, "device": ease_device, **plan.describe()}
        else:
            valid = inputs.splits["valid"]
            # keeping the best B through the sweep saves refitting it (an O(I³) factorisation) when
            # one more float32 [I, I] matrix fits too
            keep_best = plan.available_bytes is not None and ease_peak_bytes(
                num_items, plan.dtype, num_users=inputs.train.num_users, chunk_size=options.chunk_size, keep_best=True
            ) <= USABLE_MEMORY_SHARE * plan.available_bytes  # fmt: skip
            log.info("EASE: Gram matrix of %d items (%s), λ tuned on valid over %s", num_items, plan.dtype,
                     list(options.ease_lambdas))
            gram = gram_matrix(inputs.train, dtype=gram_dtype(inputs.train.num_users, plan.dtype), device=ease_device)
            tuning = tune_ease(
                inputs.train, valid.exclude, valid.relevant, lambdas=options.ease_lambdas, k=options.ease_tune_k,
                max_users=options.ease_tune_users, seed=options.seed, chunk_size=options.chunk_size, dtype=plan.dtype,
                device=ease_device, gram=gram, keep_best=keep_best,
            )  # fmt: skip
            if tuning.b is not None:
                ease_b = tuning.b
            else:  # refitted in G's memory when the dtypes match
                ease_b = ease_from_gram(gram, tuning.best_lambda, dtype=plan.dtype, overwrite=True)
            del gram
            tuning.b = None  # ease_b holds it
            ease_info = {
                "lambda": tuning.best_lambda,
                "tuned_on": f"valid {tuning.metric}, {tuning.num_users} users",
                "grid": {str(lam): value for lam, value in tuning.scores.items()},
                "fit_on": "train interactions (binary); input row = the user's masked items",
                "device": ease_device,
                "best_b_kept": keep_best,
                **plan.describe(),
            }
    ials_model, ials_info = _fit_ials(inputs, options)

    splits_out: dict[str, Any] = {}
    curves: dict[str, dict[str, np.ndarray]] = {}
    model_top: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # split -> the model's (ids, scores)
    for name, split in inputs.splits.items():
        log.info("%s: ranking %d users (%s), metrics, breakdowns", name, split.relevant.num_users,
                 ", ".join([model, "popularity"] + (["EASE"] if ease_b is not None else [])))
        queries = _tensor(split.user_emb, device)
        ranked = {}
        ranked[model] = exact_topk(queries, items, kmax, exclude=split.exclude, chunk_size=options.chunk_size)
        counts_t = torch.from_numpy(item_counts).to(device)
        ranked["popularity"] = popularity_topk(counts_t, queries.shape[0], kmax, exclude=split.exclude, chunk_size=options.chunk_size)
        if ease_b is not None:
            ranked["ease"] = ease_topk(ease_b, split.exclude, kmax, exclude=split.exclude, chunk_size=options.chunk_size)
        if ials_model is not None:
            ranked["ials"] = ials_topk(ials_model, split.exclude, kmax, exclude=split.exclude, chunk_size=options.chunk_size, device=device)
        ids = {m: r[1].cpu().numpy() for m, r in ranked.items()}
        model_top[name] = (ids[model], ranked[model][0].cpu().numpy())
        users_train = user_train_items[np.asarray(split.users, dtype=np.int64)]
        splits_out[name] = {
            "num_users": int(split.relevant.num_users),
            "num_relevant_pairs": int(split.relevant.nnz),
            "num_masked_pairs": int(split.exclude.nnz),
            "metrics": {m: compute_metrics(i, split.relevant, ks, num_items=num_items) for m, i in ids.items()},
            "breakdowns": {
                m: breakdowns(
                    i, split.relevant, ks, user_train_counts=users_train, item_train_counts=item_counts,
                    activity_edges=options.activity_edges, head_share=options.head_share, tail_share=options.tail_share,
                )  # fmt: skip
                for m, i in ids.items()
            },
        }
        curves[name] = {m: recall_curve(i, split.relevant) for m, i in ids.items()}
        splits_out[name]["recall_curve"] = {m: c.tolist() for m, c in curves[name].items()}
    del ease_b, ials_model

    ann = _ann_section(inputs, options, kmax, ks, num_items)
    names = _load_names(inputs.dataset_dir, inputs.train.num_users, num_items)
    rec_split = _pick(options.recommend_split, inputs.splits)
    recommendations = _recommendations(inputs, rec_split, *model_top[rec_split], options.recommend_k or kmax, names)
    report = {
        "model": model,
        "checkpoint": inputs.checkpoint,
        "dataset": _dataset_section(inputs, names, num_items),
        "protocol": describe_protocol(inputs),
        "ks": ks,
        "headline_k": headline_k,
        "splits": splits_out,
        "ease": ease_info,
        "ials": ials_info,
        "ann": ann,
        "gaps": _gap_statements(splits_out, model, headline_k, ease_info, ials_info),
        "more_like_this": _more_like_this(items, item_counts, names, options),
        "breakdown_definitions": {
            "user_activity": f"users bucketed by distinct training items at edges {list(options.activity_edges)} (lower bounds)",
            "item_popularity": (
                f"items sorted by training count (desc, ties by id); head = the most popular items holding the first "
                f"{options.head_share:.0%} of training interactions, tail = the least popular items holding the last "
                f"{options.tail_share:.0%} (and every item unseen in training), torso = the rest; recall@K of a bucket "
                "= hits among the user's relevant items of that bucket / their number, averaged over users having any"
            ),
        },
        "recommendations": {"split": rec_split, "k": int(options.recommend_k or kmax), "rows": int(len(recommendations))},
        "run": dict(inputs.extra),
    }
    return EvalReport(report=report, recommendations=recommendations, curves=curves)


def _pick(preferred: str, splits: dict) -> str:
    return preferred if preferred in splits else list(splits)[-1]


def _plan_ease(train: UserItemCSR, options: ReportOptions) -> tuple[str, EasePlan]:
    """Where and in which dtype EASE fits: on ``options.device`` when its free memory allows, else on
    the CPU (a GPU rarely holds the I x I matrices of a large catalogue); the plan that ran last
    (the CPU's) when neither fits."""
    devices = [options.device] + (["cpu"] if torch.device(options.device).type != "cpu" else [])
    for device in devices:
        available = options.ease_available_bytes
        if available is None:
            available = available_memory_bytes(device)
        plan = plan_ease(train.num_items, train.num_users, available, chunk_size=options.chunk_size)
        if plan.dtype is not None:
            break
    return device, plan


def _fit_ials(inputs: EvalInputs, options: ReportOptions) -> tuple[Any, dict]:
    """iALS tuned on valid (``tune_ials``): the best grid point's model and the report's "ials" block."""
    if not options.ials:
        return None, {"skipped": "iALS disabled (ReportOptions.ials=False)"}
    if "valid" not in inputs.splits:
        return None, {"skipped": "no 'valid' split given to tune iALS on"}
    valid = inputs.splits["valid"]
    log.info("iALS: %d factors, λ %s x α %s tuned on valid", options.ials_factors, list(options.ials_regularizations),
             list(options.ials_alphas))
    try:
        tuning = tune_ials(
            inputs.train, valid.exclude, valid.relevant, regularizations=options.ials_regularizations, alphas=options.ials_alphas,
            factors=options.ials_factors, iterations=options.ials_iterations, k=options.ease_tune_k,
            max_users=options.ease_tune_users, seed=options.seed, chunk_size=options.chunk_size, device=options.device,
        )  # fmt: skip
    except ImportError as e:
        return None, {"skipped": str(e)}
    return tuning.model, {
        "regularization": tuning.best_regularization,
        "alpha": tuning.best_alpha,
        "factors": tuning.factors,
        "iterations": tuning.iterations,
        "seed": options.seed,
        "tuned_on": f"valid {tuning.metric}, {tuning.num_users} users",
        "grid": [{"regularization": reg, "alpha": alpha, tuning.metric: value} for (reg, alpha), value in tuning.scores.items()],
        "tuning_seconds": round(tuning.seconds, 2),
        "fit_on": "train interactions (binary); user factors re-solved from the user's masked items",
        "library": "implicit (CPU, conjugate-gradient ALS)",
    }


def _ease_skip_reason(inputs: EvalInputs, options: ReportOptions, num_items: int) -> dict | None:
    if not options.ease:
        return {"skipped": "EASE disabled (ReportOptions.ease=False)"}
    if num_items > options.ease_max_items:
        gb = num_items**2 * 4 / 1e9
        return {
            "skipped": f"catalogue of {num_items} items > {options.ease_max_items}: B alone would be "
            f"{num_items}² float32 = {gb:.1f} GB and the inverse O(I³)"
        }
    if "valid" not in inputs.splits:
        return {"skipped": "no 'valid' split given to tune λ on"}
    return None


def _ann_section(inputs: EvalInputs, options: ReportOptions, k: int, ks: list[int], num_items: int) -> dict:
    if not options.ann_kinds:
        return {"skipped": "ANN disabled (ReportOptions.ann_kinds is empty)"}
    name = _pick(options.ann_split, inputs.splits)
    split = inputs.splits[name]
    log.info("FAISS: %s indexes on the %s users, recall against the exact top-%d", ", ".join(options.ann_kinds), name, k)
    try:
        summary, ids = compare_ann(
            inputs.item_emb, split.user_emb, k, exclude=split.exclude, kinds=options.ann_kinds,
            params=options.ann_params, chunk_size=options.chunk_size, seed=options.seed,
        )  # fmt: skip
    except ImportError as e:
        return {"skipped": str(e)}
    summary["split"] = name
    for kind, entry in summary["indexes"].items():
        entry["metrics"] = compute_metrics(ids[kind], split.relevant, ks, num_items=num_items)
    return summary


def _dataset_section(inputs: EvalInputs, names: _Names, num_items: int) -> dict:
    meta = names.meta
    return {
        "dir": None if inputs.dataset_dir is None else str(inputs.dataset_dir),
        "name": meta.get("name"),
        "protocol": meta.get("protocol"),
        "counts": meta.get("counts"),
        "num_users": int(meta.get("num_users", inputs.train.num_users)),
        "num_items": num_items,
        "num_train_pairs": int(inputs.train.nnz),
        "has_user_raw_ids": names.user_raw is not None,
        "has_item_raw_ids": names.item_raw is not None,
        "has_titles": names.titles is not None,
    }


def _gap_statements(splits_out: dict, model: str, k: int, ease_info: dict, ials_info: dict) -> list[str]:
    """One sentence per split: the model's Recall@k as a share of EASE's and iALS's and a multiple of popularity's."""
    out = []
    key = f"recall@{k}"
    for name, split in splits_out.items():
        metrics = split["metrics"]
        r = metrics[model][key]
        parts = []
        for baseline, info in (("ease", ease_info), ("ials", ials_info)):
            label = MODEL_LABELS[baseline]
            if baseline in metrics:
                b = metrics[baseline][key]
                if math.isfinite(b) and b > 0:
                    parts.append(f"{100 * r / b:.1f}% of {label}'s ({b:.4f})")
            else:
                parts.append(f"{label} not run: {info.get('skipped', 'n/a')}")
        p = metrics["popularity"][key]
        if math.isfinite(p) and p > 0:
            parts.append(f"{r / p:.2f}× popularity's ({p:.4f})")
        elif math.isfinite(p):
            parts.append("popularity scores 0")
        out.append(f"On {name}, the {model}'s Recall@{k} is {r:.4f}: " + "; ".join(parts) + ".")
    return out


def _recommendations(inputs: EvalInputs, split_name: str, ids: np.ndarray, scores: np.ndarray, k: int, names: _Names) -> pd.DataFrame:
    """Long table, one row per (user, rank) with an item: split, user_id, [user_raw_id], rank (1-based),
    item_id, [item_raw_id], [title], score. Slots left empty (fewer than k unmasked items) are omitted."""
    split = inputs.splits[split_name]
    k = min(k, ids.shape[1])
    ids, scores = ids[:, :k], scores[:, :k]
    users = np.repeat(np.asarray(split.users, dtype=np.int64), k)
    ranks = np.tile(np.arange(1, k + 1, dtype=np.int64), ids.shape[0])
    flat_ids, flat_scores = ids.reshape(-1), scores.reshape(-1)
    keep = flat_ids >= 0
    df = pd.DataFrame({"split": split_name, "user_id": users[keep]})
    if names.user_raw is not None:
        df["user_raw_id"] = names.user_raw[users[keep]]
    df["rank"] = ranks[keep]
    df["item_id"] = flat_ids[keep]
    if names.item_raw is not None:
        df["item_raw_id"] = names.item_raw[flat_ids[keep]]
    if names.titles is not None:
        df["title"] = pd.Categorical(names.titles[flat_ids[keep]])
    df["score"] = flat_scores[keep].astype(np.float32)
    return df


def _more_like_this(items: torch.Tensor, item_counts: np.ndarray, names: _Names, options: ReportOptions) -> list[dict]:
    """For the most popular items (count desc, id asc): nearest items by cosine of item embeddings."""
    num_items = items.shape[0]
    n_seed, n_sim = min(options.num_seed_items, num_items), min(options.num_similar_items, num_items - 1)
    if n_seed == 0 or n_sim <= 0:
        return []
    seeds = np.lexsort((np.arange(num_items), -np.asarray(item_counts, dtype=np.float64)))[:n_seed]
    unit = torch.nn.functional.normalize(items, dim=1)
    itself = UserItemCSR.from_pairs(np.arange(n_seed), seeds, num_users=n_seed, num_items=num_items)
    sims, nearest = exact_topk(unit[torch.from_numpy(seeds).to(unit.device)], unit, n_sim, exclude=itself)
    out = []
    for j, seed in enumerate(seeds):
        neighbours = [
            {"item_id": int(i), "name": _item_label(int(i), names), "cosine": float(s)}
            for i, s in zip(nearest[j].tolist(), sims[j].tolist())
            if i >= 0
        ]
        out.append({"item_id": int(seed), "name": _item_label(int(seed), names), "train_count": int(item_counts[seed]), "nearest": neighbours})
    return out


# ------------------------------------------------------------------------------- writing


def _jsonable(obj: Any) -> Any:
    """NaN / inf -> None (strict JSON), numpy scalars and arrays -> Python."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={v}" for k, v in x.items())
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return lines


def _label(model: str, report: dict) -> str:
    del report  # same labels in every report
    return MODEL_LABELS.get(model, model)


def format_markdown(report: dict) -> str:
    """report.md from the report dict (tables, protocol, gaps, ANN, more like this)."""
    ks, hk, model = report["ks"], report["headline_k"], report["model"]
    ds = report["dataset"]
    out = [f"# Offline evaluation: {model}", ""]
    out += [f"- checkpoint: `{report['checkpoint'] or 'n/a'}`", f"- dataset dir: `{ds['dir'] or 'n/a'}`"]
    if ds.get("name"):
        out.append(f"- dataset: {ds['name']} (split protocol {ds.get('protocol')})")
    counts = ds.get("counts") or {}
    count_text = ", ".join(f"{s} {n:,}" for s, n in counts.items())
    out.append(f"- {ds['num_users']:,} users, {ds['num_items']:,} items, {ds['num_train_pairs']:,} distinct training pairs" + (f"; interactions: {count_text}" if count_text else ""))
    out += ["", "## Protocol", ""]
    out.append(
        f"Full ranking over all {report['protocol']['num_candidates']:,} items (no sampled candidates); "
        "items the user interacted with in the masked splits are never recommended; "
        f"{report['protocol']['ties']}; {report['protocol']['users']}."
    )
    out += [""] + [f"- {s}" for s in report["protocol"]["sentences"].values()]
    out += ["", f"Recall@K = {report['protocol']['recall']}. NDCG: {report['protocol']['ndcg']}.", ""]
    out += ["## Summary", ""] + [f"- {s}" for s in report["gaps"]] + [""]

    for name, split in report["splits"].items():
        out += [f"## {name} ({split['num_users']:,} users, {split['num_relevant_pairs']:,} held-out pairs)", ""]
        models = list(split["metrics"])
        cols = [f"{m}@{k}" for m in ("recall", "ndcg") for k in ks]
        out += _table(["model", *cols], [[_label(m, report), *(split["metrics"][m][c] for c in cols)] for m in models]) + [""]
        cols = [f"{m}@{k}" for m in ("recall_liang", "hit_rate", "mrr", "coverage") for k in ks]
        out += _table(["model", *cols], [[_label(m, report), *(split["metrics"][m][c] for c in cols)] for m in models]) + [""]
        key = f"recall@{hk}"
        out += [f"### Recall@{hk} by user activity (distinct training items)", ""]
        buckets = split["breakdowns"][model]["user_activity"]["buckets"]
        rows = []
        for j, b in enumerate(buckets):
            rows.append([b["bucket"], b["num_users_evaluated"], *(split["breakdowns"][m]["user_activity"]["buckets"][j][key] for m in models)])
        out += _table(["training items", "users", *(_label(m, report) for m in models)], rows) + [""]
        out += [f"### Recall@{hk} by item popularity", ""]
        rows = []
        for j, b in enumerate(split["breakdowns"][model]["item_popularity"]["buckets"]):
            per_model = [split["breakdowns"][m]["item_popularity"]["buckets"][j] for m in models]
            rows.append(
                [b["bucket"], b["num_items"], b["train_interaction_share"], b["num_relevant_pairs"],
                 *(p[key] for p in per_model), *(p[f"topk_share@{hk}"] for p in per_model)]
            )  # fmt: skip
        header = ["bucket", "items", "train share", "held-out pairs", *(f"recall {_label(m, report)}" for m in models),
                  *(f"top-{hk} share {_label(m, report)}" for m in models)]  # fmt: skip
        out += _table(header, rows) + [""]
    out += [f"Buckets: {report['breakdown_definitions']['item_popularity']}.", ""]

    ease = report["ease"]
    out += ["## EASE", ""]
    if "skipped" in ease:
        out += [f"EASE skipped: {ease['skipped']}.", ""]
    else:
        out += [f"λ = {ease['lambda']:g}, chosen by {ease['tuned_on']}; fitted on {ease['fit_on']}.", ""]
        if ease.get("dtype"):
            have = ease.get("available_memory_gb")
            out += [f"Inverse in {ease['dtype']} on {ease['device']}: estimated peak {ease['peak_memory_gb_estimate']:.1f} GB"
                    + (f" of {have:.1f} GB available." if have is not None else " (available memory unknown)."), ""]  # fmt: skip
        out += _table(["λ", "valid recall"], [[f"{float(l):g}", v] for l, v in ease["grid"].items()]) + [""]

    ials = report.get("ials", {"skipped": "n/a"})
    out += ["## iALS", ""]
    if "skipped" in ials:
        out += [f"iALS skipped: {ials['skipped']}.", ""]
    else:
        out += [
            f"λ = {ials['regularization']:g}, α = {ials['alpha']:g} ({ials['factors']} factors, {ials['iterations']} iterations, "
            f"seed {ials['seed']}), chosen by {ials['tuned_on']} in {ials['tuning_seconds']:.0f} s; fitted on {ials['fit_on']}; "
            f"{ials['library']}.", "",
        ]  # fmt: skip
        metric = next(key for key in ials["grid"][0] if key not in ("regularization", "alpha"))
        out += _table(["λ", "α", f"valid {metric.split('@')[0]}"], [[f"{g['regularization']:g}", f"{g['alpha']:g}", g[metric]] for g in ials["grid"]]) + [""]

    ann = report["ann"]
    out += ["## Approximate retrieval (FAISS)", ""]
    if "skipped" in ann:
        out += [f"Not run: {ann['skipped']}", ""]
    else:
        k = ann["k"]
        out += [f"{ann['split']} split, {ann['num_queries']:,} queries, top-{k}, masking as above; threads: {_fmt(ann['threads'])}. Batched = all queries in chunks; single query = median of queries searched one at a time.", ""]
        rows = [["exact (torch)", 1.0, report["splits"][ann["split"]]["metrics"][model][f"recall@{k}"], None,
                 ann["exact"]["ms_per_query"], ann["exact"]["users_per_s"], ann["exact"]["single_query_ms"]]]  # fmt: skip
        for kind, e in ann["indexes"].items():
            rows.append([f"{kind} ({_fmt(e['params'])})" if e["params"] else kind, e["recall_vs_exact"], e["metrics"][f"recall@{k}"], e["build_s"],
                         e["ms_per_query"], e["users_per_s"], e["single_query_ms"]])  # fmt: skip
        out += _table(["index", f"recall vs exact@{k}", f"recall@{k}", "build s", "ms/query (batched)", "users/s", "single query ms"], rows)
        out += [""]
        for kind, e in ann["indexes"].items():
            if e.get("nprobe_sweep"):
                out += [f"{kind}: recall against speed as more of its {e['params']['nlist']} lists are scanned per query (nprobe = nlist scans all):", ""]
                out += _table(["nprobe", f"recall vs exact@{k}", "ms/query (batched)", "users/s"],
                              [[p["nprobe"], p["recall_vs_exact"], p["ms_per_query"], p["users_per_s"]] for p in e["nprobe_sweep"]])
                out += [""]

    out += ["## Recall vs K", "", "![recall at K](recall_at_k.png)", ""]
    if report["more_like_this"]:
        out += ["## More like this (cosine of item embeddings)", ""]
        for seed in report["more_like_this"]:
            near = ", ".join(f"{n['name']} ({n['cosine']:.2f})" for n in seed["nearest"])
            out.append(f"- **{seed['name']}** ({seed['train_count']:,} training interactions): {near}")
        out.append("")
    rec = report["recommendations"]
    out += [f"Per-user top-{rec['k']} of the {model} on {rec['split']}: `recommendations.parquet` ({rec['rows']:,} rows).", ""]
    return "\n".join(out)


def plot_recall_at_k(curves: dict[str, dict[str, np.ndarray]], ks: Sequence[int], path: Path, model: str) -> None:
    """recall_at_k.png: one panel per split, Recall@K for K = 1..max(ks), a line per model, dots at ks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no display, no pyplot state
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * max(len(curves), 1), 4.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(curves), 1), squeeze=False)[0]
    for ax, (split, per_model) in zip(axes, curves.items()):
        for m, curve in per_model.items():
            x = np.arange(1, curve.shape[0] + 1)
            (line,) = ax.plot(x, curve, label=MODEL_LABELS.get(m, m), linewidth=2.2 if m == model else 1.4)
            at = [k - 1 for k in ks if k <= curve.shape[0]]
            ax.plot(x[at], curve[at], "o", color=line.get_color(), markersize=3.5)
        ax.set_title(f"{split}: full ranking, seen items masked")
        ax.set_xlabel("K")
        ax.set_ylabel("Recall@K")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png")

    _write_atomic(path, save)


def write_report(result: EvalReport, run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Writes report.json, report.md, recall_at_k.png, recommendations.parquet into ``out_dir`` (None: ``<run_dir>/eval/``)."""
    out_dir = Path(out_dir) if out_dir else Path(run_dir) / EVAL_DIR
    report = _jsonable(result.report)

    def text(content: str) -> Callable[[Path], None]:
        return lambda tmp: tmp.write_text(content)

    _write_atomic(out_dir / "report.json", text(json.dumps(report, indent=2, allow_nan=False) + "\n"))
    _write_atomic(out_dir / "report.md", text(format_markdown(report)))
    plot_recall_at_k(result.curves, report["ks"], out_dir / "recall_at_k.png", report["model"])
    _write_atomic(out_dir / "recommendations.parquet", lambda tmp: result.recommendations.to_parquet(tmp, index=False))
    return out_dir


def evaluate_and_report(inputs: EvalInputs, run_dir: str | Path, options: ReportOptions = ReportOptions(),
                        out_dir: str | Path | None = None) -> dict:
    """``compute_report`` then ``write_report``; returns the report dict (as written to report.json)."""
    result = compute_report(inputs, options)
    write_report(result, run_dir, out_dir)
    return _jsonable(result.report)
