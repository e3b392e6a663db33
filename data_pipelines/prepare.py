"""Prepare a dataset dir once (idempotent: cached by a key of source, protocol and seed).

    $ python -m data_pipelines.prepare                      # the default synthetic dataset
    $ python -m data_pipelines.prepare +experiment=tiny
    $ python -m data_pipelines.prepare data=movielens_1m    # <data.root>/ml-1m.zip or ml-1m/, else downloaded
    $ python -m data_pipelines.prepare data=movielens_20m data/protocol=strong_generalization
    $ python -m data_pipelines.prepare data=gowalla          # ../shared/data/gowalla, LightGCN's split
    $ python -m data_pipelines.prepare data=interactions data.interactions.path=clicks.csv

The trainer calls :func:`prepare_dataset` itself, on rank 0, so this is only needed to prepare
ahead of a job. Prints the prepared dir's absolute path on its last line; writes nothing but the
dataset dir (conf/prepare.yaml: no Hydra run dir, so never into runs/<run_name>/).
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from data_pipelines.config import DataConfig, PrepareConfig, Source, to_typed
from data_pipelines.errors import DatasetError


def _split_options(cfg: DataConfig) -> dict:
    """What the MovieLens and generic sources share: where, the name, the protocol, seed and filters."""
    return dict(
        root=Path(cfg.root),
        name=cfg.name,
        protocol=cfg.protocol,
        seed=cfg.split_seed,
        min_rating=cfg.min_rating,
        min_user_interactions=cfg.min_user_interactions,
        min_item_interactions=cfg.min_item_interactions,
        num_heldout_users=cfg.num_heldout_users,
    )


def prepare_dataset(cfg: DataConfig) -> Path:
    """Return the absolute path of the prepared dataset dir for ``cfg``, preparing it if needed."""
    if cfg.source == Source.synthetic:
        from data_pipelines.synthetic import SyntheticSpec, prepare_synthetic

        unsupported = {
            k: getattr(cfg, k)
            for k in ("min_rating", "min_user_interactions", "min_item_interactions", "num_heldout_users")
            if getattr(cfg, k)
        }
        if unsupported:
            raise ValueError(f"data.source=synthetic: {unsupported} apply to MovieLens only; set them to 0")

        spec = SyntheticSpec(**asdict(cfg.synthetic))
        return Path(
            prepare_synthetic(spec, protocol=cfg.protocol, split_seed=cfg.split_seed, root=Path(cfg.root))
        ).resolve()
    if cfg.source == Source.movielens:
        from data_pipelines.movielens import prepare_movielens

        m = cfg.movielens
        return prepare_movielens(
            m.release, **_split_options(cfg), url=m.url, md5=m.md5, allow_download=m.download
        ).resolve()
    if cfg.source == Source.interactions:
        from data_pipelines.interactions import prepare_interactions

        return prepare_interactions(cfg.interactions, **_split_options(cfg)).resolve()
    raise ValueError(f"data.source={cfg.source!r}: unknown pipeline; known: {', '.join(Source)}")


def register_configs() -> None:
    """The schema conf/config.yaml names, as this entry point reads it (recsys registers its own)."""
    ConfigStore.instance().store(name="config_schema", node=PrepareConfig)


@hydra.main(config_path="../conf", config_name="prepare", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        path = prepare_dataset(to_typed(cfg, PrepareConfig).data)
    except DatasetError as e:  # bad or missing input: one message, no traceback
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    print(path)


if __name__ == "__main__":
    register_configs()
    main()
