"""Writes the serving bundle of a trained run (the layout and its reader: recsys/serving/bundle.py).

Kept apart from serving.py, which a serving process imports with torch, numpy and pyarrow alone.
The bundle is written into a temporary folder and swapped in whole; an ``out`` that holds anything
but a bundle export wrote is refused, never deleted.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_pipelines.dataset_dir import ITEMS_VOCAB, VOCAB_DIR
from recsys.config import ModelConfig
from recsys.data.dataset import RetrievalData
from recsys.data.layout import QUERY, USER, FeatureLayout, side_entries, side_specs
from recsys.evaluation.ann import build_index, require_faiss
from recsys.rankers.served import Served
from recsys.rankers.two_tower.query_encoder import sequence_entry
from recsys.serving.bundle import BUNDLE_FORMAT
from recsys.utils.atomic import replace_dir
from recsys.utils.refusals import PathTaken, RunRefused

BUNDLE_FILES = {
    "manifest.json",
    "parts",  # the served ranker's parts (recsys/rankers/served.py)
    "fusion",
    "item_embeddings.npy",
    "index.faiss",
    "items.parquet",
    "users.parquet",
    "vocab",
    "config.yaml",
    "raw_ids_users.npy",  # model.id_mapping=managed
    "raw_ids_items.npy",
    "unranked_items.npy",  # items the served ranker leaves out (never-trained ids of managed tables)
}


def _check_writable(out: Path) -> None:
    """``out``'s folder (or the nearest one that exists) takes new files: probed with an empty folder,
    so a read-only place is refused before any work (the bundle is built beside ``out``)."""
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.probe-"))
    except OSError as e:
        raise RunRefused(
            f"out_dir={out}: cannot write in {parent} ({e.strerror or e}); recsys.export builds the bundle there "
            "and renames it into place. Choose an out_dir on a writable file system"
        ) from None


def check_replaceable(out: Path) -> None:
    """Export replaces only a bundle it wrote: anything else at ``out`` is someone's data, never deleted;
    and it must be able to write there (both before any work)."""
    _check_writable(out)
    if not out.exists() and not out.is_symlink():
        return
    why = ""
    if out.is_symlink() or not out.is_dir():
        why = "it is not a folder"
    else:
        try:
            fmt = json.loads((out / "manifest.json").read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            fmt = None
        others = sorted(p.name for p in out.iterdir() if p.name not in BUNDLE_FILES)
        if not (isinstance(fmt, str) and fmt.startswith("recsys-bundle/")):
            why = "it has no manifest.json of a recsys serving bundle"
        elif others:
            why = f"it holds files a bundle does not ({', '.join(others[:5])})"
    if why:
        raise PathTaken(
            f"out_dir={out}: exists and {why}; recsys.export replaces only a bundle it wrote. "
            "Choose another out_dir (or move that one away yourself)"
        )


def query_side_features(data: RetrievalData) -> list:
    """The side features the query encoder reads, in the query tower's order (the layout's, recsys/data/layout.py)."""
    by_name = {f.name: f for f in data.side_features}
    return [by_name[s.feature] for s in side_specs(side_entries(data.side_features)) if s.tower == QUERY]


def _side_columns(data: RetrievalData, source: str) -> dict[str, pa.Array]:
    """feature_<name>: each query-tower side feature's ids of ``source`` ("users" | "items") as list<int64>."""
    return {
        f"feature_{f.name}": pa.ListArray.from_arrays(pa.array(f.indptr, pa.int64()), pa.array(f.ids, pa.int64()))
        for f in query_side_features(data)
        if f.source == source
    }


def _items_table(data: RetrievalData) -> pa.Table:
    """item_id, categories, raw_id / title where the dataset dir's vocabulary has them, side features' ids (the
    vectors are item_embeddings.npy's rows, in item_id order)."""
    categories = pa.ListArray.from_arrays(
        pa.array(data.item_category_indptr, pa.int32()), pa.array(data.item_category_ids, pa.int64())
    )
    columns = {"item_id": pa.array(np.arange(data.num_items)), "categories": categories}
    vocab = data.dir / ITEMS_VOCAB
    if vocab.is_file():
        names = pq.read_table(vocab).to_pandas().set_index("item_id").reindex(np.arange(data.num_items))
        for column in ("raw_id", "title"):
            if column in names:
                columns[column] = pa.array(names[column].tolist())
    return pa.table(columns | _side_columns(data, "items"))


def _manifest(served: Served, point: dict, index: str, data: RetrievalData, run: RunRecord) -> dict:
    unranked = served.unranked()
    return {
        "format": BUNDLE_FORMAT,
        "ranker": served.name,  # the run's headline ranker (eval.serve)
        "point": point,  # its settings, as valid chose them
        "dim": int(served.items().shape[1]),
        "index": index,
        # items never recommended (unranked_items.npy): no vector of their own (recsys/ranking/untrained.py)
        "unranked_items": 0 if unranked is None else int(unranked.sum()),
        "num_users": data.num_users,
        "num_items": data.num_items,
        "num_categories": data.num_categories,
        "side_features": [
            {
                "name": f.name,
                "table": f.table,
                "source": f.source,
                "column": f.column,
                "bundle_column": f"feature_{f.name}",
            }
            for f in query_side_features(data)
        ],
        "score": "inner product <query, item>"
        + (
            "; query = [w_i q_i / spread_i] over the parts, spread_i = sqrt(q_i' C_i q_i)"
            if len(served.parts) > 1
            else ""
        ),
        "checkpoint": str(run.checkpoint.resolve()),
        # trainer.refit: the selection stage trained on train only, the refit (<run>/refit) on train + valid
        "trained_on": run.trained_on,
        "dataset_dir": str(data.dir),
    }


@dataclass(frozen=True)
class RunRecord:
    """What the bundle records of the run it comes from."""

    checkpoint: Path  # the weights exported
    trained_on: str  # "train", or "train + valid" (a refit, data.train_on_valid)
    config_yaml: str  # the run's whole config, as its checkpoints keep it: the bundle's config.yaml


def encoder_entry(model: ModelConfig, layout: FeatureLayout, data: RetrievalData) -> dict:
    """The query encoder's layout (``layout``: the run's), as the bundle's two-tower part keeps it
    (recsys/rankers/two_tower/query_encoder.py reads it)."""
    return {
        "history_length": layout.history_length,
        "query_neighbors": layout.query_neighbors,  # the history bag through the neighbour table too
        "poolings": {t: c.pooling for t, c in model.tables.items()},
        "side_features": [
            {"name": f.name, "table": f.table, "source": f.source, "column": f.column}
            for f in query_side_features(data)
        ],
        "temperature": getattr(model.loss, "temperature", None),  # the loss's (None: a loss without one)
        "item_bias": model.uses_item_bias,  # the query vector ends with a constant 1 (recsys/model/two_tower.py)
    } | (  # a query encoder that reads the history per position: its Config and sizes (recsys.model.build's)
        {"sequence_encoder": sequence_entry(model.query_encoder, layout.history_length, _blend_width(model))}
        if layout.sequence
        else {}
    )


def _blend_width(model: ModelConfig) -> int:
    """The user table's width where the query encoder blends the user id in (what recsys.model.build gives it)."""
    return model.tables[USER].embedding_dim if model.query_encoder.user else 0


def write_bundle(
    out: Path,
    served: Served,
    point: dict,
    data: RetrievalData,
    run: RunRecord,
    index: str = "flat",
) -> None:
    """The bundle of the ``served`` ranker (completed with the run's pieces: ``Served.for_bundle``) at its chosen
    ``point`` at ``out``, replacing an earlier bundle there; ``index``: the FAISS index kind written with it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        manifest = _manifest(served, point, index, data, run)
        manifest["served"] = served.save(tmp)
        embeddings = served.items().numpy().astype(np.float32)
        np.save(tmp / "item_embeddings.npy", embeddings)
        unranked, ranked = served.unranked(), None
        if unranked is not None:  # indexed: the items it ranks, by item id
            np.save(tmp / "unranked_items.npy", np.flatnonzero(unranked.numpy()).astype(np.int64))
            ranked = np.flatnonzero(~unranked.numpy()).astype(np.int64)
        require_faiss().write_index(build_index(embeddings, index, ids=ranked), str(tmp / "index.faiss"))
        _write_catalogue(tmp, data, run, manifest)
        # every file, those of parts/ and vocab/ too: load_bundle refuses a bundle missing one, naming it
        manifest["files"] = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        check_replaceable(out)  # again: something may have appeared there while the items were embedded
        replace_dir(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the user's to fix: say where, and that nothing was replaced
            raise RunRefused(
                f"{out}: the disk is full writing the bundle ({e.strerror}); {out} is unchanged and no partial bundle "
                f"is left: free space on {out.parent} or export elsewhere (out_dir=...)"
            ) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_catalogue(tmp: Path, data: RetrievalData, run: RunRecord, manifest: dict) -> None:
    """items.parquet, users.parquet, vocab/, config.yaml and (managed ids) every index's raw id."""
    pq.write_table(_items_table(data), tmp / "items.parquet")
    users = _side_columns(data, "users")
    if users:
        pq.write_table(pa.table({"user_id": pa.array(np.arange(data.num_users))} | users), tmp / "users.parquet")
    if (data.dir / VOCAB_DIR).is_dir():
        shutil.copytree(data.dir / VOCAB_DIR, tmp / "vocab")
    (tmp / "config.yaml").write_text(run.config_yaml)
    if data.raw_user_ids is not None and data.raw_item_ids is not None:  # the bundle maps raw ids to rows itself
        np.save(tmp / "raw_ids_users.npy", data.raw_user_ids.astype(np.int64))
        np.save(tmp / "raw_ids_items.npy", data.raw_item_ids.astype(np.int64))
        manifest["id_mapping"] = "managed"
