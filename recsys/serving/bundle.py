"""Serving bundle: what a trained run becomes for online retrieval, loadable without torchrec.

Written by ``python -m recsys.export run_dir=...``; read by :func:`load_bundle` in one plain
CPU process (torch, numpy, pyarrow, faiss only)::

    <bundle>/
      manifest.json        format, the served ranker ("served": its parts and their fusion weights) and its point,
                           counts, the catalogue's feature columns, source run, "files": every file below (relative
                           paths; load_bundle refuses a bundle missing one, naming it)
      parts/<i>-<ranker>/  each part of the served ranker, written and read by its ranker's registered part type
                           (recsys/rankers/parts.py; the two-tower's: its query encoder, recsys/rankers/two_tower/part.py)
      fusion/              covariance_<i>.npy float64 [D_i, D_i]: each part's item covariance, when parts are fused
      item_embeddings.npy  float32 [num_items, D]: the served ranker's item vectors (the parts' side by side)
      index.faiss          FAISS inner-product index of item_embeddings (flat: exact; ivf_flat / hnsw by option): of the
                           items it recommends, under their item ids
      unranked_items.npy   int64: the items never recommended (manifest "unranked_items" counts them): never-trained
                           ids of managed tables, which share one row (recsys/ranking/untrained.py); when any
      items.parquet        item_id, categories (+ raw_id / title when the dataset has them,
                           + feature_<name> list<int64>: the ids of each query-side feature of items)
      users.parquet        user_id + feature_<name> list<int64> of each query-side feature of users
                           (only when there are some; manifest "side_features" lists them)
      vocab/               the dataset's raw id <-> index vocabularies, when it has them
      config.yaml          the run's resolved config
      raw_ids_<users|items>.npy  model.id_mapping=managed: int64, the raw id of every user / item index

With managed ids the bundle maps raw ids to rows itself, as the trained model did (``encode_raw``; ``encode`` takes
the dataset's indices and looks their raw ids up): an id the tables do not hold gets its range's shared last row.

The served ranker is the run's headline (eval.serve), one part or a fusion of parts (recsys/rankers/served.py,
fusion.py): its scores are inner products <query, item>, so the bundle ranks as the run's evaluation did
(tests/serving/test_export.py): ``bundle.recommend(history, k)``. No ranker is named here: the manifest says which parts a
bundle holds, and each loads through the registry.

Trust: :func:`load_bundle` runs no code from the bundle (weights load with ``torch.load(weights_only=True)``,
arrays with ``allow_pickle=False``, JSON and parquet as data); it rebuilds each part from recsys's code (a plug-in
ranker's part from the plug-in's, registered when it is imported). A bundle is still only as good as whoever wrote
it: it decides which items are recommended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from data_pipelines.errors import one_line  # plain Python
from recsys.rankers.parts import Catalogue, Query
from recsys.rankers.served import Served
from recsys.serving.inputs import (
    as_raw_ids,
    as_top_k,
    check_lengths,
    distinct_latest,
    history_indices,
    item_indices,
    user_index,
    user_indices,
)  # fmt: skip (numpy only)
from recsys.utils.refusals import MissingPath  # plain Python
from recsys.utils.safe_load import UnreadableFile, numpy_load

BUNDLE_FORMAT = "recsys-bundle/4"  # 4: the served ranker as parts (parts/, fusion/); 3: fixed files of two rankers


@dataclass
class ServingBundle:
    manifest: dict
    served: Served  # the served ranker: its parts and their fusion (recsys/rankers/served.py)
    catalogue: Catalogue  # the users and items every part may read (categories, side columns, raw ids)
    index: object | None = None  # the FAISS index over the served ranker's item vectors (index.faiss)
    unranked: np.ndarray | None = None  # bool [num_items]: items never recommended (unranked_items.npy); None: none

    @property
    def item_embeddings(self) -> torch.Tensor:
        """float32 [num_items, D]: the served ranker's item vectors (item_embeddings.npy)."""
        return self.served.items()

    @property
    def reads_users(self) -> bool:
        """Whether the served ranker's query reads the user (a user-id table, a user's side features): without, a
        user id given is refused (it would change nothing), and queries are their histories alone."""
        return self.served.reads_users

    def _check_reads_users(self, given, name: str, reads: bool) -> None:
        if given is not None and not reads:
            raise ValueError(
                f"{name}: the served ranker ({self.served.name}) reads no user: its query is the history alone (no "
                f"user-id table or user feature), so a user id would change nothing; pass {name}=None "
                "(bundle.reads_users says which bundles read one)"
            )

    def _query(self, user_ids, history_lengths, history_items, reads_users: bool | None = None) -> Query:
        """The queries checked against each other and the bundle's counts, each user's items counted once at their
        latest position (recsys/serving/inputs.py); user ids only where the ranker (``reads_users``) reads them."""
        self._check_reads_users(user_ids, "user_ids", self.reads_users if reads_users is None else reads_users)
        items = item_indices(history_items, self.manifest["num_items"], "history_items")
        users = user_indices(user_ids, self.manifest["num_users"])
        num_users = len(np.asarray(history_lengths).reshape(-1)) if users is None else len(users)
        names = ("queries" if users is None else "user_ids", "history_items")
        lengths = check_lengths(history_lengths, num_users, len(items), names)
        return Query(users, *distinct_latest(lengths, items))

    def encode(
        self, user_ids: np.ndarray | None, history_lengths: np.ndarray, history_items: np.ndarray
    ) -> torch.Tensor:
        """Query vectors ``B x D`` of the served ranker (rank items by <query, item_embeddings>).

        ``user_ids``: dataset indices (vocab/users.parquet maps raw ids), or None: queries without a user (no user
        row; a ranker that reads no user, ``reads_users``, refuses them); ``history_items``: every user's items, concatenated in user order, oldest first (``history_lengths``
        per user), each counted once at its latest position. Each part reads what it reads of them (the two-tower
        its latest manifest history_length items; the graph filter every distinct item).
        """
        return self.served.encode(self._query(user_ids, history_lengths, history_items), self.catalogue)

    def encode_part(
        self, ranker: str, user_ids: np.ndarray | None, history_lengths: np.ndarray, history_items: np.ndarray
    ) -> torch.Tensor:
        """The query vectors of one part of the served ranker (manifest "parts"), as ``encode`` takes the queries."""
        part = self.served.part(ranker)
        return part.encode(self._query(user_ids, history_lengths, history_items, part.reads_users), self.catalogue)

    def encode_raw(
        self, user_raw_ids: np.ndarray | None, history_lengths: np.ndarray, history_raw_ids: np.ndarray
    ) -> torch.Tensor:
        """Query vectors from raw ids (model.id_mapping=managed): any 64-bit ids, the dataset's or new ones (None:
        queries without a user); a history item the catalogue lacks counts with its row but no categories."""
        raw_ids = self.catalogue.raw_ids
        if raw_ids is None:
            raise ValueError(
                "encode_raw: this bundle's tables are indexed by the dataset's ids (model.id_mapping=vocab)"
            )
        self._check_reads_users(user_raw_ids, "user_raw_ids", self.reads_users)
        raw_items = as_raw_ids(history_raw_ids, "history_raw_ids")
        anonymous = user_raw_ids is None
        user_raw = None if anonymous else as_raw_ids(user_raw_ids, "user_raw_ids")
        count = len(np.asarray(history_lengths).reshape(-1)) if anonymous else len(user_raw)
        lengths = check_lengths(history_lengths, count, len(raw_items), ("user_raw_ids", "history_raw_ids"))
        lengths, raw_items = distinct_latest(lengths, raw_items)
        catalogue = raw_ids["items"]
        order = np.argsort(catalogue, kind="stable")
        pos = np.minimum(np.searchsorted(catalogue[order], raw_items), max(len(order) - 1, 0))
        known = catalogue[order][pos] == raw_items
        indices = np.where(known, order[pos], -1)  # -1: an item the catalogue lacks (no categories, no side ids)
        return self.served.encode(Query(None, lengths, indices, raw=(user_raw, raw_items)), self.catalogue)

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """Inner products ``B x num_items`` (rank by these)."""
        return queries @ self.item_embeddings.t()

    def recommend(
        self, history, k: int = 10, *, exclude_seen: bool = True, user_id: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(item indices best first, their scores) for one user from the FAISS index: at most ``k``, fewer when
        fewer items are left to recommend (never padding).

        ``history``: the user's item indices, oldest first (vocab/items.parquet maps raw ids), each counted once;
        ``user_id``: their index, read by a model with a user-id table or user features (None: a query without a user,
        which uses no user row; a ranker that reads no user, ``reads_users``, refuses one). ``exclude_seen``: the history is never recommended, as the evaluation masks it. Ties go to
        the lower item index. The items of unranked_items.npy (never-trained ids of a managed run) are never
        recommended.
        """
        self._check_reads_users(user_id, "user_id", self.reads_users)
        items = history_indices(history, self.manifest["num_items"])
        user = user_index(user_id, self.manifest["num_users"])
        ids, scores = self.recommend_batch(
            [items], k, exclude_seen=exclude_seen, user_ids=None if user is None else np.array([user])
        )
        found = ids[0] >= 0
        return ids[0][found], scores[0][found]

    def recommend_batch(
        self, histories, k: int = 10, *, exclude_seen: bool = True, user_ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``recommend`` for several users at once: (ids [B, k'], scores [B, k']), k' = min(k, the most items left
        to any of them); a row with fewer items left ends in -1 / -inf padding (-1 is no item: never index with
        it). ``user_ids``: one index per history, or None (queries without users). No histories: [0, k'] arrays."""
        from recsys.evaluation.ann import ann_topk  # noqa: PLC0415 (faiss only where recommendations are asked for)
        from recsys.ranking.interactions import UserItemCSR  # noqa: PLC0415

        k, num_items = as_top_k(k), self.manifest["num_items"]
        if isinstance(histories, (str, bytes)) or not hasattr(histories, "__len__"):
            raise ValueError(f"histories: expected a list of histories (one sequence per user), got {histories!r}")
        histories = [history_indices(h, num_items, f"histories[{i}]") for i, h in enumerate(histories)]
        self._check_reads_users(user_ids, "user_ids", self.reads_users)
        users = user_indices(user_ids, self.manifest["num_users"], len(histories))
        lengths = np.array([len(h) for h in histories], dtype=np.int64)
        ranked = np.ones(num_items, dtype=bool) if self.unranked is None else ~self.unranked
        left = np.full(len(histories), int(ranked.sum()), dtype=np.int64)  # what the index can return
        if exclude_seen:
            left -= np.array([int(ranked[np.unique(h)].sum()) for h in histories], dtype=np.int64)
        k = min(k, int(left.max()) if len(histories) else num_items)
        if k == 0 or not histories:
            return np.zeros((len(histories), k), dtype=np.int64), np.zeros((len(histories), k), dtype=np.float32)
        items = np.concatenate(histories)
        queries = self.encode(users, lengths, items)
        exclude = None
        if exclude_seen:
            exclude = UserItemCSR.from_pairs(
                np.repeat(np.arange(len(histories)), lengths), items, num_users=len(histories), num_items=num_items
            )
        scores, ids = ann_topk(self.index, queries, k, exclude=exclude)
        return ids, scores


def load_bundle(path: str | Path) -> ServingBundle:
    root = Path(path)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{manifest_path}: missing; is {root} a bundle written by `python -m recsys.export`?")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UnreadableFile(
            f"{manifest_path}: not a readable JSON manifest ({one_line(e)}); written in part or edited? Export the "
            "run again (python -m recsys.export run_dir=...)"
        ) from None
    if not isinstance(manifest, dict):
        raise UnreadableFile(f"{manifest_path}: not a bundle manifest (a JSON object); export the run again")
    if manifest.get("format") != BUNDLE_FORMAT:
        raise ValueError(
            f"{manifest_path}: format {manifest.get('format')!r}, this code reads {BUNDLE_FORMAT!r}; "
            "export the run again (python -m recsys.export run_dir=...)"
        )
    # every file export wrote (bundles before the list: not checked; before it named parts/'s files: its folders)
    for name in manifest.get("files", []):
        if not (root / name).exists():  # named by its outermost missing folder (vocab/, not vocab/items.parquet)
            outer = [*reversed(Path(name).parents[:-1]), Path(name)]
            missing = next(root / p for p in outer if not (root / p).exists())
            raise MissingPath(f"{missing}: missing; the bundle is incomplete (its manifest lists it): export again")
    from recsys.evaluation.ann import require_faiss  # noqa: PLC0415 (faiss, only where a bundle is loaded)

    return ServingBundle(
        manifest=manifest,
        served=Served.load(root, manifest["served"], str(manifest_path)),
        catalogue=_catalogue(root, manifest),
        index=require_faiss().read_index(str(root / "index.faiss")),
        unranked=_unranked(root, manifest),
    )


def _catalogue(root: Path, manifest: dict) -> Catalogue:
    """The bundle's users and items: categories (items.parquet), the query-side feature columns, raw ids."""
    items = pq.read_table(root / "items.parquet", columns=["item_id", "categories"])
    indptr, category_ids = _list_column(items.column("categories"))
    side_columns = {}
    for f in manifest.get("side_features", []):
        column = pq.read_table(root / SIDE_FILES[f["source"]], columns=[f["bundle_column"]]).column(0)
        side_columns[f["name"]] = (f["source"], *_list_column(column))
    raw_ids = None
    if manifest.get("id_mapping") == "managed":
        raw_ids = {side: numpy_load(root / f"raw_ids_{side}.npy") for side in ("users", "items")}
    return Catalogue(manifest["num_users"], manifest["num_items"], indptr, category_ids, side_columns, raw_ids)


def _unranked(root: Path, manifest: dict) -> np.ndarray | None:
    """bool [num_items] of the items the bundle never recommends (unranked_items.npy), None when it has none."""
    if not manifest.get("unranked_items"):
        return None
    mask = np.zeros(manifest["num_items"], dtype=bool)
    mask[numpy_load(root / "unranked_items.npy")] = True
    return mask


SIDE_FILES = {"users": "users.parquet", "items": "items.parquet"}  # a side feature's column, in the bundle


def _list_column(column) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, ids) of a list<int64> column."""
    values = column.combine_chunks()
    indptr = values.offsets.to_numpy().astype(np.int64)
    return indptr - indptr[0], values.flatten().to_numpy().astype(np.int64)
