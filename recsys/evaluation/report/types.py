"""The report's inputs, options and result (shared by compute, markdown and plot)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from recsys.config import EvalConfig
from recsys.evaluation.ann import ANN_KINDS, AnnParams
from recsys.evaluation.breakdowns import ACTIVITY_EDGES
from recsys.rankers.registry import REPORT_BASELINES, TRAINED
from recsys.ranking.interactions import UserItemCSR

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
        graphs: split name -> [num_users rows, I] CSR of every user's items of the splits it follows (what
            the graph filter is fit on: valid's is train, test's train + valid); None: valid's is ``train``.
        unranked_items: bool [I], the items the model ranks never (never-trained ids of managed tables, as the
            run left them out); None: it ranks every item.
    """

    item_emb: np.ndarray | torch.Tensor
    splits: dict[str, SplitInputs]
    train: UserItemCSR
    ks: Sequence[int]
    item_train_counts: np.ndarray | None = None
    dataset_dir: str | Path | None = None
    checkpoint: str = ""
    model_name: str = TRAINED
    extra: dict = field(default_factory=dict)
    graphs: dict[str, UserItemCSR] | None = None
    unranked_items: np.ndarray | None = None  # bool [I]: items the model leaves out (recsys/ranking/untrained.py)

    def item_counts(self) -> np.ndarray:
        """[I] training counts per item: ``item_train_counts``, else distinct training users per item."""
        if self.item_train_counts is not None:
            return np.asarray(self.item_train_counts)
        return np.bincount(self.train.indices, minlength=self.train.num_items)


@dataclass
class ReportOptions:
    """What to compute beyond the model's own metrics.

    Attributes:
        available_bytes: the memory the rankers' resource checks plan with; None = measured when the report runs.
        stage_rankers: the rows the report adds beyond the model and popularity, each ranked through the run's
            evaluation stage (recsys.evaluation.stage: tuned on valid, fit on the interactions its split follows;
            ``EvalInputs.graphs``) or left out with why its resource check refused it; needs a "valid" split.
        default_rankers: those of ``stage_rankers`` that came from a default list (recsys.evaluate's rankers=null):
            the cost plan may run them at a lower graph-filter rank or leave them out (recsys/rankers/stage_cost.py);
            the others are ranked whatever they cost, with a warning.
        ranker_config: their settings and the tuning metric: the run's ``eval`` section.
        ann_kinds: FAISS indexes to compare with exact search; empty disables ANN.
        ann_params: their settings.
        ann_split: split whose users are searched ("test", else the last split given).
        recommend_split: split whose top-K goes to recommendations.parquet ("test", else the last).
        recommend_k: rows per user in the parquet (None: max(ks)).
        headline_k: K of the gap sentences and breakdown tables (20; max(ks) if 20 is not in ks).
        num_seed_items / num_similar_items: "more like this": the most popular items and how many
            nearest items (cosine of item embeddings) each.
        chunk_size: query rows per score matrix chunk (memory ~ chunk_size x I x 4 bytes).
        device: torch device for the model's exact scoring.
        activity_edges, head_share, tail_share: bucket definitions (``breakdowns`` module).
        seed: iALS's initial factors, the graph filter's eigensolver, the latency sample.
    """

    available_bytes: int | None = None
    stage_rankers: Sequence[str] = REPORT_BASELINES
    default_rankers: Sequence[str] = ()
    ranker_config: EvalConfig = field(default_factory=EvalConfig)
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
