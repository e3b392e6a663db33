"""Export a trained run as a serving bundle (see recsys/serving.py for the layout).

    $ python -m recsys.export run_dir=runs/default                      # -> runs/default/export/
    $ torchrun --standalone --nproc_per_node=2 -m recsys.export run_dir=runs/default

The checkpoint is loaded on this job's ranks (any world size), every item is embedded by the
sharded model, and the query-side tables are gathered whole to rank 0: the query encoder serves
from one process, so the user, item and category tables must fit in that host's memory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hydra
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.elastic.multiprocessing.errors import record

from recsys.config import query_uses_user_id, register_configs, reject_unknown_keys
from recsys.data.batches import FeatureBuilder
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.evaluate import load_run_config, load_trained
from recsys.evaluation.evaluator import embed
from recsys.logs import setup_logging
from recsys.serving import BUNDLE_FORMAT, QueryEncoder, dynamic_shapes, example_inputs

log = logging.getLogger(__name__)


@dataclass
class ExportConfig:
    run_dir: str = MISSING  # the training run to export
    checkpoint: str = ""  # checkpoint dir; "" = <run_dir>/checkpoints/best
    out_dir: str = ""  # bundle dir; "" = <run_dir>/export (replaced atomically, and only if it holds a bundle export wrote)
    batch_size: int = 4096  # items embedded per forward pass
    device: str = "auto"  # "auto" | "cpu" | "cuda": where the tables are loaded to embed the items (the bundle is CPU either way)


@torch.no_grad()
def full_tables(module: torch.nn.Module, rank: int, device: torch.device = torch.device("cpu")) -> dict:
    """Every embedding table whole on rank 0, on the CPU (collective; other ranks get an empty dict).

    The gather runs on ``device``, the process group's device: NCCL rejects CPU output buffers.
    """
    out = {}
    for key, value in module.state_dict().items():
        if ".embedding_bags." not in key:
            continue
        table = key.split(".")[-2]
        if isinstance(value, ShardedTensor):
            full = torch.empty(value.size(), device=device) if rank == 0 else None
            value.gather(dst=0, out=full)
        else:
            full = value.detach()
        if rank == 0:
            out[table] = full.cpu().clone()
    return out


BUNDLE_FILES = {"manifest.json", "query_encoder.pt", "query_encoder.pt2", "item_embeddings.npy", "items.parquet", "vocab", "config.yaml"}


def check_replaceable(out: Path) -> None:
    """Export replaces only a bundle it wrote: anything else at ``out`` is someone's data, never deleted."""
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
        raise FileExistsError(f"out_dir={out}: exists and {why}; recsys.export replaces only a bundle it wrote. "
                              "Choose another out_dir (or move that one away yourself)")


def export_run(ecfg: ExportConfig) -> Path:
    run_dir = Path(ecfg.run_dir)
    out = Path(ecfg.out_dir) if ecfg.out_dir else run_dir / "export"
    check_replaceable(out)  # before any work, on every rank
    cfg = load_run_config(run_dir, ecfg.checkpoint)
    env = init_distributed(ecfg.device)  # this machine's device, not necessarily the training run's
    sharded = None
    try:
        # the bundle needs the items and the vocabularies, no interactions: each rank reads only its users'
        data, sharded, checkpoint = load_trained(cfg, run_dir, ecfg.checkpoint, env, whole_data=False)
        two_tower = sharded.module.module.model
        two_tower.eval()
        builder = FeatureBuilder(data, cfg.data.history_length, query_uses_user_id(cfg))
        item_emb = embed(two_tower, builder, side="candidate", ids=np.arange(data.num_items), timeline=None,
                         batch_size=ecfg.batch_size, device=env.device, rank=env.rank, world_size=env.world_size)
        tables = full_tables(sharded.module, env.rank, env.device)
        if env.is_main:
            encoder = QueryEncoder(
                tables, {t: c.pooling for t, c in cfg.model.tables.items()},
                two_tower.query_tower.cpu(), with_history=cfg.data.history_length > 0,
            ).eval()
            _write_bundle(out, encoder, item_emb, data, cfg, checkpoint)
            log.info("serving bundle: %s", out)
        return out
    finally:
        del sharded
        destroy_distributed(env)


def _write_bundle(out: Path, encoder: QueryEncoder, item_emb: torch.Tensor, data, cfg, checkpoint: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        program = torch.export.export(encoder, example_inputs(), dynamic_shapes=dynamic_shapes())
        torch.export.save(program, str(tmp / "query_encoder.pt2"))
        torch.save(encoder.state_dict(), tmp / "query_encoder.pt")  # what load_bundle reads (weights only)
        embeddings = item_emb.numpy().astype(np.float32)
        np.save(tmp / "item_embeddings.npy", embeddings)
        categories = pa.ListArray.from_arrays(pa.array(data.item_category_indptr, pa.int32()), pa.array(data.item_category_ids, pa.int64()))
        columns = {"item_id": pa.array(np.arange(data.num_items)), "categories": categories,
                   "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), embeddings.shape[1])}
        vocab = data.dir / "vocab"
        if (vocab / "items.parquet").is_file():
            names = pq.read_table(vocab / "items.parquet").to_pandas().set_index("item_id").reindex(np.arange(data.num_items))
            for column in ("raw_id", "title"):
                if column in names:
                    columns[column] = pa.array(names[column].tolist())
        pq.write_table(pa.table(columns), tmp / "items.parquet")
        if vocab.is_dir():
            shutil.copytree(vocab, tmp / "vocab")
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        manifest = {
            "format": BUNDLE_FORMAT,
            "dim": int(embeddings.shape[1]),
            "num_users": data.num_users,
            "num_items": data.num_items,
            "num_categories": data.num_categories,
            "history_length": cfg.data.history_length,
            "poolings": {t: c.pooling for t, c in cfg.model.tables.items()},
            "temperature": cfg.model.temperature,
            "score": "inner product <query, item>",
            "checkpoint": str(checkpoint.resolve()),
            "dataset_dir": str(data.dir),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        old = out.with_name(f".{out.name}.old")
        check_replaceable(out)  # again: something may have appeared there while the items were embedded
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


ConfigStore.instance().store(name="export_schema", node=ExportConfig)
register_configs()


@record
@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    setup_logging(int(os.environ.get("RANK", "0")))  # console: recsys's lines; library chatter: the log file, rank 0
    reject_unknown_keys(cfg)
    print(export_run(OmegaConf.to_object(cfg)))


if __name__ == "__main__":
    main()
