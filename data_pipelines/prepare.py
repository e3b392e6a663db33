"""Prepare a dataset dir once (idempotent: cached by a key of source, protocol and seed).

    $ python -m data_pipelines.prepare                      # the default synthetic dataset
    $ python -m data_pipelines.prepare +experiment=tiny

The trainer calls :func:`prepare_dataset` itself, on rank 0, so this is only needed to prepare
ahead of a job. Prints the prepared dir's absolute path on its last line.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from recsys.config import DataConfig, register_configs, to_config

PIPELINES = ("synthetic",)


def prepare_dataset(cfg: DataConfig) -> Path:
    """Return the absolute path of the prepared dataset dir for ``cfg``, preparing it if needed."""
    if cfg.source == "synthetic":
        from data_pipelines.synthetic import SyntheticSpec, prepare_synthetic

        s = cfg.synthetic
        spec = SyntheticSpec(
            num_users=s.num_users,
            num_items=s.num_items,
            num_categories=s.num_categories,
            num_interactions=s.num_interactions,
            latent_dim=s.latent_dim,
            min_interactions_per_user=s.min_interactions_per_user,
            seed=s.seed,
        )
        return Path(prepare_synthetic(spec, protocol=cfg.protocol, split_seed=cfg.split_seed, root=Path(cfg.root))).resolve()
    raise ValueError(f"data.source={cfg.source!r}: unknown pipeline; known: {', '.join(PIPELINES)}")


register_configs()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    print(prepare_dataset(to_config(cfg).data))


if __name__ == "__main__":
    main()
