"""The tiny experiment's config, composed through the real Hydra config tree (what every end-to-end test runs)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir

from recsys.config import Config, register_configs, to_config

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = str(ROOT / "conf")


def tiny_config(overrides: Sequence[str] = ()) -> Config:
    """The real Hydra config tree with ``+experiment=tiny`` and ``overrides`` applied."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=tiny", *overrides])
    return to_config(cfg)
