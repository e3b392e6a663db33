"""Serving bundle: what a trained run becomes for online retrieval, loadable without torchrec.

Written by ``python -m recsys.export run_dir=...``; read by :func:`load_bundle` in one plain
CPU process (torch, numpy, pyarrow, faiss only)::

    <bundle>/
      manifest.json        format, the served ranker and its point, dims, counts, poolings, source run
      query_encoder.pt     QueryEncoder's weights (a state dict of tensors): the two-tower's query side
      query_encoder.pt2    torch.export program of QueryEncoder (batch and bag sizes dynamic), for
                           torch.export consumers; its loader unpickles objects, so load_bundle never
                           reads it: load it only from a bundle you made or trust
      item_embeddings.npy  float32 [num_items, D]: the served ranker's item vectors
      graph_query.npy      float32 [num_items, G]: the graph filter's query table (row j is what item j adds
                           to a query), when the served ranker has the graph filter as a part
      covariance_*.npy     float64 [D_part, D_part]: each part's item covariance, for a fusion's spread
      index.faiss          FAISS inner-product index of item_embeddings (flat: exact; ivf_flat / hnsw by option): of the
                           items it recommends, under their item ids
      unranked_items.npy   int64: the items never recommended (manifest "unranked_items" counts them): never-trained
                           ids of managed tables, which share one row (recsys/evaluation/untrained.py); when any
      items.parquet        item_id, categories (+ raw_id / title when the dataset has them,
                           + feature_<name> list<int64>: the ids of each query-tower side feature of items)
      users.parquet        user_id + feature_<name> list<int64> of each query-tower side feature of users
                           (only when there are some; manifest "side_features" lists them in the tower's order)
      vocab/               the dataset's raw id <-> index vocabularies, when it has them
      config.yaml          the run's resolved config
      id_map_<table>.npy   model.id_mapping=managed: int64 [2, n], the managed table's hashed raw ids (ascending) and
                           their rows (manifest "managed" holds each table's row ranges); ``RawIdMap``
      raw_ids_<users|items>.npy  model.id_mapping=managed: int64, the raw id of every user / item index

With managed ids the bundle maps raw ids to rows itself, as the trained model did (``encode_raw``; ``encode`` takes
the dataset's indices and looks their raw ids up): an id the tables do not hold gets its range's shared last row.

The served ranker is the run's headline (eval.serve): the two-tower, or its fusion with the graph filter
(recsys/rankers/fusion.py), whose query is [q_tt / spread, beta * q_graph / spread] and whose items are
[c_tt, c_graph]. Scores are inner products <query, item>, so the bundle ranks as the run's evaluation did
(tests/test_served.py): ``bundle.recommend(history, k)``.

Trust: :func:`load_bundle` runs no code from the bundle (weights load with ``torch.load(weights_only=True)``,
arrays with ``allow_pickle=False``, JSON and parquet as data); it rebuilds QueryEncoder from recsys's code
(recsys/query_encoder.py: its layout from the manifest, recsys/data/layout.py). A bundle is still only as good
as whoever wrote it: it decides which items are recommended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from data_pipelines.errors import one_line  # plain Python
from recsys.data.ragged import gather_ranges, gather_rows, segment_sum  # numpy only
from recsys.data.raw_ids import KEY_SPACE, hash_keys_numpy  # numpy / torch only
from recsys.query_encoder import QueryEncoder, dynamic_shapes, example_inputs, load_encoder  # noqa: F401 (torch only)
from recsys.rankers.fusion import spread  # torch only
from recsys.refusals import MissingPath  # plain Python
from recsys.safe_load import UnreadableFile, numpy_load
from recsys.serving_inputs import (
    as_raw_ids,
    as_top_k,
    check_lengths,
    distinct_latest,
    history_indices,
    item_indices,
    user_index,
    user_indices,
)  # fmt: skip (numpy only)

BUNDLE_FORMAT = "recsys-bundle/3"  # 3: the served ranker (fusions, graph_query.npy, index.faiss); 2: the encoder from query_encoder.pt


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))


@dataclass
class RawIdMap:
    """A managed table's raw id -> row map (recsys/model/managed.py), as the trained model's MCH modules held it."""

    keys: np.ndarray  # int64 [n], ascending: hashed raw ids (recsys.data.raw_ids.hash_keys_numpy)
    rows: np.ndarray  # int64 [n]: each key's row
    segments: list[int]  # row offsets of the ranks' ranges, then the table's rows

    def rows_of(self, raw_ids: np.ndarray) -> np.ndarray:
        """Rows of ``raw_ids`` (int64); an id the table does not hold gets the last row of its key's range."""
        keys = hash_keys_numpy(np.asarray(raw_ids, dtype=np.int64))
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        found = self.keys[pos] == keys if len(self.keys) else np.zeros(len(keys), dtype=bool)
        block = -(-KEY_SPACE // (len(self.segments) - 1))  # torchrec's row-wise bucket of a key
        last_rows = np.asarray(self.segments[1:], dtype=np.int64) - 1
        return np.where(found, self.rows[pos] if len(self.keys) else 0, last_rows[keys // block])


@dataclass
class ServingBundle:
    manifest: dict
    encoder: nn.Module | None  # the two-tower's query side; None when the served ranker is the graph filter alone
    item_embeddings: torch.Tensor  # num_items x D: the served ranker's item vectors
    category_indptr: np.ndarray
    category_ids: np.ndarray
    # per query-tower side feature (manifest "side_features" order): its source and (indptr, ids) over users / items
    side_columns: tuple[tuple[str, np.ndarray, np.ndarray], ...] = ()
    graph_query: torch.Tensor | None = None  # num_items x G: the graph filter's query table (a sum-pooled bag)
    covariances: dict[str, torch.Tensor] | None = None  # a fusion's per-part item covariances (its spread)
    index: object | None = None  # the FAISS index over item_embeddings (index.faiss)
    # model.id_mapping=managed: each managed table's map, and the raw ids of the dataset's user / item indices
    id_maps: dict[str, RawIdMap] | None = None
    raw_ids: dict[str, np.ndarray] | None = None  # "users" / "items" -> int64 [num_users] / [num_items]
    unranked: np.ndarray | None = None  # bool [num_items]: items never recommended (unranked_items.npy); None: none

    def encode_two_tower(
        self, user_ids: np.ndarray | None, history_lengths: np.ndarray, history_items: np.ndarray
    ) -> torch.Tensor:
        """The two-tower's query embeddings ``B x D_tt`` (unit norm) from user ids (None: queries without a user,
        which use no user row) and their history (each user's items concatenated, oldest first; the tower reads
        each user's latest ``history_length`` distinct items)."""
        user_ids, history_lengths, history_items = self._checked_bags(user_ids, history_lengths, history_items)
        anonymous = user_ids is None
        users = np.full(len(history_lengths), -1) if user_ids is None else user_ids
        history_lengths, history_items = _latest(history_lengths, history_items, self.manifest.get("history_length", 0))
        if self.id_maps is not None:  # managed ids: the indices' raw ids, then the tables' rows
            assert self.raw_ids is not None
            user_keys = users if anonymous else self.raw_ids["users"][users]
            return self._encode_rows(
                users, history_lengths, history_items, user_keys, self.raw_ids["items"][history_items],
                anonymous=anonymous,
            )  # fmt: skip
        return self._encode_rows(users, history_lengths, history_items, users, history_items, anonymous=anonymous)

    def _checked_bags(self, user_ids, history_lengths, history_items) -> tuple:
        """(user ids or None, lengths, items), checked against each other and the bundle's counts, each user's
        items counted once at their latest position (recsys/serving_inputs.py)."""
        items = item_indices(history_items, self.manifest["num_items"], "history_items")
        users = user_indices(user_ids, self.manifest["num_users"])
        num_users = len(np.asarray(history_lengths).reshape(-1)) if users is None else len(users)
        names = ("queries" if users is None else "user_ids", "history_items")
        lengths = check_lengths(history_lengths, num_users, len(items), names)
        return (users, *distinct_latest(lengths, items))

    def encode_raw(
        self, user_raw_ids: np.ndarray | None, history_lengths: np.ndarray, history_raw_ids: np.ndarray
    ) -> torch.Tensor:
        """The two-tower's query embeddings from raw ids (model.id_mapping=managed): any 64-bit ids, the dataset's
        or new ones (None: queries without a user); a history item the catalogue lacks counts with its row but no
        categories."""
        if self.id_maps is None or self.raw_ids is None:
            raise ValueError(
                "encode_raw: this bundle's tables are indexed by the dataset's ids (model.id_mapping=vocab)"
            )
        anonymous = user_raw_ids is None
        raw_items = as_raw_ids(history_raw_ids, "history_raw_ids")
        user_raw = np.zeros(len(history_lengths), np.int64) if anonymous else as_raw_ids(user_raw_ids, "user_raw_ids")
        lengths = check_lengths(history_lengths, len(user_raw), len(raw_items), ("user_raw_ids", "history_raw_ids"))
        lengths, raw_items = _latest(*distinct_latest(lengths, raw_items), self.manifest.get("history_length", 0))
        catalogue = self.raw_ids["items"]
        order = np.argsort(catalogue, kind="stable")
        pos = np.minimum(np.searchsorted(catalogue[order], raw_items), max(len(order) - 1, 0))
        known = catalogue[order][pos] == raw_items
        indices = np.where(known, order[pos], -1)  # -1: an item the catalogue lacks (no categories, no side ids)
        return self._encode_rows(np.full(len(user_raw), -1), lengths, indices, user_raw, raw_items, anonymous=anonymous)

    def _encode_rows(
        self,
        user_ids: np.ndarray,
        history_lengths: np.ndarray,
        history_items: np.ndarray,
        user_keys: np.ndarray,
        item_keys: np.ndarray,
        *,
        anonymous: bool = False,
    ) -> torch.Tensor:
        """The encoder on users / history items given by index (categories, side features; -1: unknown) and by
        what their tables are looked up with (``*_keys``: the indices, or raw ids when managed). ``anonymous``:
        no user row at all (the encoder pools an empty user bag: zeros)."""
        cat_lengths, cats = _gather_known(self.category_indptr, self.category_ids, history_items)
        per_user = segment_sum(cat_lengths, history_lengths)
        side = []
        for source, indptr, ids in self.side_columns:  # a user's own ids, or those of all their history items
            lengths, values = _gather_known(indptr, ids, user_ids if source == "users" else history_items)
            if source == "items":
                lengths = segment_sum(lengths, history_lengths)
            side += [torch.from_numpy(values.astype(np.int64)), _offsets(lengths)]
        if self.id_maps is not None:
            user_keys = self.id_maps["user"].rows_of(user_keys) if "user" in self.id_maps else user_keys
            item_keys = self.id_maps["item"].rows_of(item_keys)
        if anonymous:
            user_keys = np.full(len(history_lengths), -1)  # QueryEncoder: a negative user id pools no row
        assert self.encoder is not None
        with torch.no_grad():
            return self.encoder(
                torch.from_numpy(np.asarray(user_keys, dtype=np.int64)),
                torch.from_numpy(np.asarray(item_keys, dtype=np.int64)),
                _offsets(history_lengths),
                torch.from_numpy(cats.astype(np.int64)),
                _offsets(per_user),
                side or None,
            )

    def encode_graph(self, history_lengths: np.ndarray, history_items: np.ndarray) -> torch.Tensor:
        """The graph filter's query ``B x G``: the sum of graph_query's rows over each user's distinct items."""
        assert self.graph_query is not None
        lengths = np.asarray(history_lengths, dtype=np.int64)
        items = np.asarray(history_items, dtype=np.int64)
        users = np.repeat(np.arange(len(lengths)), lengths)
        keys = np.unique(users * self.manifest["num_items"] + items)  # a user's item counts once (a binary row)
        users, items = keys // self.manifest["num_items"], keys % self.manifest["num_items"]
        out = torch.zeros(len(lengths), self.graph_query.shape[1])
        out.index_add_(0, torch.from_numpy(users), self.graph_query[torch.from_numpy(items)])
        return out

    def encode(
        self, user_ids: np.ndarray | None, history_lengths: np.ndarray, history_items: np.ndarray
    ) -> torch.Tensor:
        """Query vectors ``B x D`` of the served ranker (rank items by <query, item_embeddings>).

        ``user_ids``: dataset indices (vocab/users.parquet maps raw ids), or None: queries without a user (no user
        row); ``history_items``: every user's items, concatenated in user order, oldest first (``history_lengths``
        per user), each counted once at its latest position. The two-tower reads each user's latest
        manifest["history_length"]; the graph filter every distinct item.
        """
        user_ids, history_lengths, history_items = self._checked_bags(user_ids, history_lengths, history_items)
        parts = []
        if self.encoder is not None:
            parts.append(("two_tower", self.encode_two_tower(user_ids, history_lengths, history_items)))
        if self.graph_query is not None:
            parts.append(("graph_filter", self.encode_graph(history_lengths, history_items)))
        if len(parts) == 1:
            return parts[0][1]
        assert self.covariances is not None
        beta = float(self.manifest["point"]["beta"])
        (a_name, a), (b_name, b) = parts
        return torch.cat(
            [a / spread(a, self.covariances[a_name])[:, None], beta * b / spread(b, self.covariances[b_name])[:, None]],
            dim=1,
        )

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """Inner products ``B x num_items`` (rank by these)."""
        return queries @ self.item_embeddings.t()

    def recommend(
        self, history, k: int = 10, *, exclude_seen: bool = True, user_id: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(item indices best first, their scores) for one user from the FAISS index: at most ``k``, fewer when
        fewer items are left to recommend (never padding).

        ``history``: the user's item indices, oldest first (vocab/items.parquet maps raw ids), each counted once;
        ``user_id``: their index, read by a model with a user-id table (None: a query without a user, which uses
        no user row). ``exclude_seen``: the history is never recommended, as the evaluation masks it. Ties go to
        the lower item index. The items of unranked_items.npy (never-trained ids of a managed run) are never
        recommended.
        """
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
        from recsys.evaluation.interactions import UserItemCSR  # noqa: PLC0415

        k, num_items = as_top_k(k), self.manifest["num_items"]
        if isinstance(histories, (str, bytes)) or not hasattr(histories, "__len__"):
            raise ValueError(f"histories: expected a list of histories (one sequence per user), got {histories!r}")
        histories = [history_indices(h, num_items, f"histories[{i}]") for i, h in enumerate(histories)]
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


def _gather_known(indptr: np.ndarray, ids: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``gather_rows`` where an index of -1 (an id the dataset lacks: ``encode_raw``) has no values."""
    index = np.asarray(index, dtype=np.int64)
    known = index >= 0
    if known.all():
        return gather_rows(indptr, ids, index)
    lengths, values = gather_rows(indptr, ids, index[known])
    full = np.zeros(len(index), dtype=lengths.dtype)
    full[known] = lengths
    return full, values


def _latest(lengths: np.ndarray, items: np.ndarray, history_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Each user's last ``history_length`` items (all of them when it is 0 or they are fewer)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    if history_length <= 0 or not (lengths > history_length).any():
        return lengths, items
    ends = np.cumsum(lengths)
    kept = np.minimum(lengths, history_length)
    return kept, gather_ranges(ends - kept, ends, items)[1]


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
    for name in manifest.get("files", []):  # every file export wrote (bundles before the list: not checked)
        if not (root / name).exists():
            raise MissingPath(f"{root / name}: missing; the bundle is incomplete (its manifest lists it): export again")
    encoder = load_encoder(root / "query_encoder.pt", manifest, manifest_path) if manifest["two_tower_dim"] else None
    graph_query = torch.from_numpy(numpy_load(root / "graph_query.npy")) if manifest["graph_dim"] else None
    covariances = None
    if encoder is not None and graph_query is not None:
        covariances = {
            p: torch.from_numpy(numpy_load(root / f"covariance_{p}.npy")) for p in ("two_tower", "graph_filter")
        }
    items = pq.read_table(root / "items.parquet", columns=["item_id", "categories"])
    indptr, category_ids = _list_column(items.column("categories"))
    side_columns = []
    for f in manifest.get("side_features", []):
        file = root / SIDE_FILES[f["source"]]
        column = pq.read_table(file, columns=[f["bundle_column"]]).column(0)
        side_columns.append((f["source"], *_list_column(column)))
    from recsys.evaluation.ann import require_faiss  # noqa: PLC0415 (faiss, only where a bundle is loaded)

    id_maps = raw_ids = None
    if manifest.get("id_mapping") == "managed":
        id_maps = {}
        for table, info in manifest["managed"].items():
            keys_rows = numpy_load(root / f"id_map_{table}.npy")
            id_maps[table] = RawIdMap(keys_rows[0], keys_rows[1], [int(v) for v in info["segments"]])
        raw_ids = {side: numpy_load(root / f"raw_ids_{side}.npy") for side in ("users", "items")}
    return ServingBundle(
        manifest=manifest,
        encoder=encoder,
        id_maps=id_maps,
        raw_ids=raw_ids,
        item_embeddings=torch.from_numpy(numpy_load(root / "item_embeddings.npy")),
        category_indptr=indptr,
        category_ids=category_ids,
        side_columns=tuple(side_columns),
        graph_query=graph_query,
        covariances=covariances,
        index=require_faiss().read_index(str(root / "index.faiss")),
        unranked=_unranked(root, manifest),
    )


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
