"""Serving bundle: what a trained run becomes for online retrieval, loadable without torchrec.

Written by ``python -m recsys.export run_dir=...``; read by :func:`load_bundle` in one plain
CPU process (torch, numpy, pyarrow only)::

    <bundle>/
      manifest.json        format, dims, counts, feature order, source run and checkpoint
      query_encoder.pt2    torch.export program of QueryEncoder (batch and bag sizes dynamic)
      item_embeddings.npy  float32 [num_items, D], L2-normalised: FAISS IndexFlatIP-ready
      items.parquet        item_id, categories, embedding (+ raw_id / title when the dataset has them)
      vocab/               the dataset's raw id <-> index vocabularies, when it has them
      config.yaml          the run's resolved config

Scores are inner products <query, item> (the training logits times the temperature), so the
ranking equals the trained model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

from recsys.data.ragged import gather_rows, segment_sum  # numpy only

BUNDLE_FORMAT = "recsys-bundle/1"


class QueryEncoder(nn.Module):
    """The query tower with its own unsharded tables (plain nn.EmbeddingBag).

    forward(user_ids [B], history_item_ids [N], history_offsets [B],
            history_categories [M], history_category_offsets [B]) -> [B, D], unit norm.
    Offsets are bag starts (PyTorch EmbeddingBag convention); bags may be empty (pool to 0).
    """

    def __init__(self, tables: Dict[str, torch.Tensor], poolings: Dict[str, str], tower: nn.Sequential, *, with_history: bool) -> None:
        super().__init__()
        self.with_history = with_history
        self.with_categories = with_history and "category" in tables  # none for data without categories
        self.with_user = "user" in tables  # none when the query is its history bag alone (model.query_user_id)
        if self.with_user:
            self.user = nn.EmbeddingBag.from_pretrained(tables["user"], mode=poolings["user"], freeze=True)
        if with_history:
            self.item = nn.EmbeddingBag.from_pretrained(tables["item"], mode=poolings["item"], freeze=True)
        if self.with_categories:
            self.category = nn.EmbeddingBag.from_pretrained(tables["category"], mode=poolings["category"], freeze=True)
        self.tower = tower

    def forward(
        self,
        user_ids: torch.Tensor,
        history_item_ids: torch.Tensor,
        history_offsets: torch.Tensor,
        history_categories: torch.Tensor,
        history_category_offsets: torch.Tensor,
    ) -> torch.Tensor:
        pooled = []
        if self.with_user:
            pooled.append(self.user(user_ids, torch.arange(user_ids.shape[0], device=user_ids.device)))
        if self.with_history:
            pooled.append(self.item(history_item_ids, history_offsets))
        if self.with_categories:
            pooled.append(self.category(history_categories, history_category_offsets))
        return F.normalize(self.tower(torch.cat(pooled, dim=1)), dim=-1)


def example_inputs() -> Tuple[torch.Tensor, ...]:
    """Inputs used to trace the encoder: 3 users, one with an empty history (sizes >= 2, or
    torch.export specialises a dynamic size to the constant 0 or 1)."""
    return (
        torch.tensor([0, 0, 0]), torch.tensor([0, 0, 0, 0]), torch.tensor([0, 2, 4]),
        torch.tensor([0, 0, 0, 0, 0]), torch.tensor([0, 3, 5]),
    )


def dynamic_shapes() -> Dict[str, Dict[int, torch.export.Dim]]:
    batch = torch.export.Dim("batch", min=1)
    return {
        "user_ids": {0: batch},
        "history_item_ids": {0: torch.export.Dim("history", min=0)},
        "history_offsets": {0: batch},
        "history_categories": {0: torch.export.Dim("categories", min=0)},
        "history_category_offsets": {0: batch},
    }


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))


@dataclass
class ServingBundle:
    manifest: dict
    encoder: nn.Module
    item_embeddings: torch.Tensor  # num_items x D
    category_indptr: np.ndarray
    category_ids: np.ndarray

    def encode(self, user_ids: np.ndarray, history_lengths: np.ndarray, history_items: np.ndarray) -> torch.Tensor:
        """Query embeddings ``B x D`` from user ids and their recent items (concatenated, oldest first)."""
        user_ids = np.asarray(user_ids, dtype=np.int64)
        history_lengths = np.asarray(history_lengths, dtype=np.int64)
        history_items = np.asarray(history_items, dtype=np.int64)
        for name, ids, size in (("user_ids", user_ids, self.manifest["num_users"]), ("history_items", history_items, self.manifest["num_items"])):
            if ids.size and (ids.min() < 0 or ids.max() >= size):
                raise ValueError(f"{name}: ids must be in [0, {size}), got {int(ids.min())}..{int(ids.max())}")
        cat_lengths, cats = gather_rows(self.category_indptr, self.category_ids, history_items)
        per_user = segment_sum(cat_lengths, history_lengths)
        with torch.no_grad():
            return self.encoder(
                torch.from_numpy(user_ids), torch.from_numpy(history_items), _offsets(history_lengths),
                torch.from_numpy(cats.astype(np.int64)), _offsets(per_user),
            )

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """Inner products ``B x num_items`` (rank by these)."""
        return queries @ self.item_embeddings.t()


def load_bundle(path: str | Path) -> ServingBundle:
    root = Path(path)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: missing; is {root} a bundle written by `python -m recsys.export`?")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}, this code reads {BUNDLE_FORMAT!r}")
    encoder = torch.export.load(str(root / "query_encoder.pt2")).module()
    items = pq.read_table(root / "items.parquet", columns=["item_id", "categories"])
    categories = items.column("categories").combine_chunks()
    indptr = categories.offsets.to_numpy().astype(np.int64)
    return ServingBundle(
        manifest=manifest,
        encoder=encoder,
        item_embeddings=torch.from_numpy(np.load(root / "item_embeddings.npy")),
        category_indptr=indptr - indptr[0],
        category_ids=categories.flatten().to_numpy().astype(np.int64),
    )
