"""compute_report: every split ranked by the model and the stage's rankers, metrics, breakdowns, ANN, recommendations.

Plain arrays in, a JSON-able dict out; no process group, nothing written.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from recsys.data.dataset import read_dataset_meta, read_vocabularies
from recsys.evaluation.ann import compare_ann
from recsys.evaluation.breakdowns import breakdowns
from recsys.evaluation.report.stage_rankers import rank_stage_rankers
from recsys.evaluation.report.types import EvalInputs, EvalReport, ReportOptions, SplitInputs
from recsys.rankers.registry import POPULARITY, ranker_label
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.metrics import compute_metrics, hit_matrix
from recsys.ranking.retrieval import exact_topk
from recsys.ranking.scoring import rank_and_score

log = logging.getLogger("recsys.evaluation.report")  # one line per stage: the report's steps take seconds to minutes


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


@dataclass
class _Names:
    """What the dataset dir says of the ids (each None where it does not) and its meta.json ({} without one)."""

    user_raw: np.ndarray | None  # object [num_users]
    item_raw: np.ndarray | None  # object [I]
    titles: np.ndarray | None  # object [I]
    meta: dict


def _load_names(dataset_dir: str | Path | None, num_users: int, num_items: int) -> _Names:
    if dataset_dir is None:
        return _Names(None, None, None, {})
    vocab = read_vocabularies(dataset_dir, num_users, num_items)
    return _Names(vocab.user_raw, vocab.item_raw, vocab.titles, read_dataset_meta(Path(dataset_dir), required=False))


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


def compute_report(inputs: EvalInputs, options: ReportOptions = ReportOptions()) -> EvalReport:
    """Ranks every split with the model, popularity and the stage's rankers (``options.stage_rankers``, each where its
    resource check lets it), and measures everything.

    Returns an ``EvalReport``; nothing is written (``write_report`` does that).
    """
    ks = sorted({int(k) for k in inputs.ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive cut-offs, got {list(inputs.ks)}")
    kmax = max(ks)
    num_items = int(inputs.train.num_items)
    items = _tensor(inputs.item_emb, options.device)
    if items.shape[0] != num_items:
        raise ValueError(f"item_emb has {items.shape[0]} rows, train has {num_items} items")
    item_counts = inputs.item_counts()
    stage_ids, stage_info = rank_stage_rankers(inputs, options)
    stage = {k: v for k, v in stage_info.items() if k != "plan"}  # each ranker's row or why it was skipped
    baselines = _Baselines(stage_ids)
    ranked = {
        name: _rank_split(name, split, items, item_counts, baselines, inputs, options, ks)
        for name, split in inputs.splits.items()
    }
    del baselines, stage_ids  # free the rankings before ANN
    splits_out = {name: r.section for name, r in ranked.items()}
    headline_k = options.headline_k if options.headline_k in ks else kmax
    names = _load_names(inputs.dataset_dir, inputs.train.num_users, num_items)
    rec_split = _pick(options.recommend_split, inputs.splits)
    top_ids, top_scores = ranked[rec_split].model_top
    recommendations = _recommendations(inputs, rec_split, top_ids, top_scores, options.recommend_k or kmax, names)
    report = {
        "model": inputs.model_name,
        "checkpoint": inputs.checkpoint,
        "dataset": _dataset_section(inputs, names, num_items),
        "protocol": describe_protocol(inputs),
        "ks": ks,
        "headline_k": headline_k,
        "splits": splits_out,
        "stage": stage,
        "evaluation_plan": stage_info.get("plan"),  # each stage ranker's estimated cost, what the plan decided
        "ann": _ann_section(inputs, options, kmax, ks, num_items),
        "gaps": _gap_statements(splits_out, inputs.model_name, headline_k, stage["rankers"]),
        "more_like_this": _more_like_this(items, item_counts, names, options),
        "breakdown_definitions": _breakdown_definitions(options),
        "recommendations": {
            "split": rec_split,
            "k": int(options.recommend_k or kmax),
            "rows": int(len(recommendations)),
        },
        "run": dict(inputs.extra),
    }
    curves = {name: r.curves for name, r in ranked.items()}
    return EvalReport(report=report, recommendations=recommendations, curves=curves)


@dataclass
class _Baselines:
    """What the report ranks beside the model: the top-k ids the evaluation stage ranked ({split: {ranker: ids}})."""

    stage_ids: dict[str, dict[str, np.ndarray]]

    def rankers(self, name: str, split: SplitInputs, kmax: int, options: ReportOptions) -> dict[str, Any]:
        """Ranker name -> a function returning its (scores, ids) of ``split``'s users."""
        return {  # ranked by the evaluation stage already
            ranker: (lambda ids=ids: (torch.zeros(ids.shape), torch.from_numpy(ids)))
            for ranker, ids in self.stage_ids.get(name, {}).items()
        }


@dataclass
class _RankedSplit:
    section: dict[str, Any]  # the split's block of report.json
    curves: dict[str, np.ndarray]  # ranker -> recall@1..kmax
    model_top: tuple[np.ndarray, np.ndarray]  # the model's (ids, scores)


def _rank_split(
    name: str,
    split: SplitInputs,
    items: torch.Tensor,
    item_counts: np.ndarray,
    baselines: _Baselines,
    inputs: EvalInputs,
    options: ReportOptions,
    ks: list[int],
) -> _RankedSplit:
    """The model, popularity and every baseline on one split: metrics, breakdowns and recall curves."""
    kmax, model = max(ks), inputs.model_name
    others = baselines.rankers(name, split, kmax, options)
    log.info(
        "%s: ranking %d users (%s), metrics, breakdowns",
        name,
        split.relevant.num_users,
        ", ".join([model, *others]),
    )
    ranked, metrics = rank_and_score(
        _tensor(split.user_emb, options.device), items, kmax, exclude=split.exclude, relevant=split.relevant, ks=ks,
        chunk_size=options.chunk_size, model=model, others=others,
        unranked=None if inputs.unranked_items is None else torch.from_numpy(inputs.unranked_items),
    )  # fmt: skip
    ids = {m: r[1].cpu().numpy() for m, r in ranked.items()}
    section = _split_section(split, ids, metrics, ks, inputs.train.lengths(), item_counts, options)
    curves = {m: recall_curve(i, split.relevant) for m, i in ids.items()}
    section["recall_curve"] = {m: c.tolist() for m, c in curves.items()}
    return _RankedSplit(section, curves, (ids[model], ranked[model][0].cpu().numpy()))


def _breakdown_definitions(options: ReportOptions) -> dict[str, str]:
    return {
        "user_activity": f"users bucketed by distinct training items at edges {list(options.activity_edges)} (lower bounds)",
        "item_popularity": (
            f"items sorted by training count (desc, ties by id); head = the most popular items holding the first "
            f"{options.head_share:.0%} of training interactions, tail = the least popular items holding the last "
            f"{options.tail_share:.0%} (and every item unseen in training), torso = the rest; recall@K of a bucket "
            "= hits among the user's relevant items of that bucket / their number, averaged over users having any"
        ),
    }


def _split_section(
    split: SplitInputs,
    ids: dict[str, np.ndarray],
    metrics: dict[str, dict],
    ks: list[int],
    user_train_items: np.ndarray,
    item_counts: np.ndarray,
    options: ReportOptions,
) -> dict[str, Any]:
    """One split's block: counts, each model's metrics and activity / popularity breakdowns."""
    users_train = user_train_items[np.asarray(split.users, dtype=np.int64)]
    return {
        "num_users": int(split.relevant.num_users),
        "num_relevant_pairs": int(split.relevant.nnz),
        "num_masked_pairs": int(split.exclude.nnz),
        "metrics": metrics,
        "breakdowns": {
            m: breakdowns(
                i,
                split.relevant,
                ks,
                user_train_counts=users_train,
                item_train_counts=item_counts,
                activity_edges=options.activity_edges,
                head_share=options.head_share,
                tail_share=options.tail_share,
            )  # fmt: skip
            for m, i in ids.items()
        },
    }


def _pick(preferred: str, splits: dict) -> str:
    return preferred if preferred in splits else list(splits)[-1]


def _ann_section(inputs: EvalInputs, options: ReportOptions, k: int, ks: list[int], num_items: int) -> dict:
    if not options.ann_kinds:
        return {"skipped": "ANN disabled (ReportOptions.ann_kinds is empty)"}
    name = _pick(options.ann_split, inputs.splits)
    split = inputs.splits[name]
    log.info(
        "FAISS: %s indexes on the %s users, recall against the exact top-%d", ", ".join(options.ann_kinds), name, k
    )
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


def _gap_statements(splits_out: dict, model: str, k: int, stage_rows: dict) -> list[str]:
    """One sentence per split: the model's Recall@k as a share of each stage ranker's (or why it was not run) and a
    multiple of popularity's."""
    out = []
    key = f"recall@{k}"
    for name, split in splits_out.items():
        metrics = split["metrics"]
        r = metrics[model][key]
        parts = []
        for ranker, row in stage_rows.items():
            if ranker == POPULARITY:  # a multiple of the floor, below
                continue
            label = ranker_label(ranker)
            if ranker in metrics:
                b = metrics[ranker][key]
                if math.isfinite(b) and b > 0:
                    parts.append(f"{100 * r / b:.1f}% of {label}'s ({b:.4f})")
            else:
                parts.append(f"{label} not run: {row.get('skipped', 'n/a')}")
        p = metrics[POPULARITY][key] if POPULARITY in metrics else math.nan
        if math.isfinite(p) and p > 0:
            parts.append(f"{r / p:.2f}× popularity's ({p:.4f})")
        elif math.isfinite(p):
            parts.append("popularity scores 0")
        out.append(f"On {name}, the {model}'s Recall@{k} is {r:.4f}: " + "; ".join(parts) + ".")
    return out


def _recommendations(
    inputs: EvalInputs, split_name: str, ids: np.ndarray, scores: np.ndarray, k: int, names: _Names
) -> pd.DataFrame:
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
        out.append(
            {
                "item_id": int(seed),
                "name": _item_label(int(seed), names),
                "train_count": int(item_counts[seed]),
                "nearest": neighbours,
            }
        )
    return out
