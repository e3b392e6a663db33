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

import errno
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from data_pipelines.config import DataConfig, PrepareConfig, Source, pipeline_data
from data_pipelines.dataset_dir import dropped_rows_report, read_meta
from data_pipelines.errors import ConfigError, DatasetError, one_line


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


def _check_root(root: str) -> None:
    """``data.root`` must be a folder, or a path whose nearest existing part is one."""
    path = Path(root)
    for part in (path, *path.parents):
        if part.exists() or part.is_symlink():
            if not part.is_dir():
                what = "is" if part == path else f"is inside {part}, which is"
                raise DatasetError(
                    f"data.root={root}: {what} a file, not a folder; data.root is the folder prepared dataset "
                    "dirs are written in (RECSYS_DATA_ROOT, default data/): give a folder"
                )
            return


def _no_space(e: OSError) -> bool:
    return e.errno == errno.ENOSPC or "No space left on device" in str(e)


def prepare_dataset(cfg: DataConfig) -> Path:
    """Return the absolute path of the prepared dataset dir for ``cfg``, preparing it if needed.

    Bad input is a ``DatasetError``; so is a full disk (naming where it was writing): every
    pipeline writes beside its target and renames, so nothing is left half written.
    """
    _check_root(cfg.root)
    try:
        return _prepare(cfg)
    except OSError as e:
        if not _no_space(e):
            raise
        where = e.filename or Path(cfg.root).absolute()
        raise DatasetError(
            f"{where}: no space left on device while preparing the dataset (data.root={cfg.root}); nothing was "
            "left half written: free space there, or set data.root to a folder on a larger disk, and run again"
        ) from None


def _prepare(cfg: DataConfig) -> Path:
    if cfg.source == Source.synthetic:
        from data_pipelines.synthetic import SyntheticSpec, prepare_synthetic

        unsupported = {
            k: getattr(cfg, k)
            for k in ("min_rating", "min_user_interactions", "min_item_interactions", "num_heldout_users")
            if getattr(cfg, k)
        }
        if unsupported:
            raise ConfigError(f"data.source=synthetic: {unsupported} apply to MovieLens only; set them to 0")

        try:
            spec = SyntheticSpec(**asdict(cfg.synthetic))
        except ValueError as e:  # the spec's own checks name its fields: they are data.synthetic.*'s
            raise ConfigError(str(e).replace("SyntheticSpec", "data.synthetic")) from None
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
        data, left = pipeline_data(cfg.data)
        if left:  # stderr: the last line of stdout is the path
            print(f"{', '.join(left)}: the trainer's settings, not the data pipelines': not read here", file=sys.stderr)
        path = prepare_dataset(data)
    except (DatasetError, ConfigError) as e:  # bad or missing input: one message, no traceback
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(1)
    for line in dropped_rows_report(read_meta(path)):  # stderr: the last line of stdout is the path
        print(line, file=sys.stderr)
    print(path)


if __name__ == "__main__":
    register_configs()
    main()
