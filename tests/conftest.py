"""Shared fixtures: the tiny experiment's config and dataset, and one in-process gloo group."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
from hydra import compose, initialize_config_dir

from recsys.config import Config, register_configs, to_config

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def tiny_config(overrides: List[str] = ()) -> Config:
    """The real Hydra config tree with ``+experiment=tiny`` and ``overrides`` applied."""
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+experiment=tiny", *overrides])
    return to_config(cfg)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """Prepared datasets shared by every test of the session (preparing is idempotent)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny_data(data_root):
    from data_pipelines.prepare import prepare_dataset
    from recsys.data.dataset import load_dataset

    return load_dataset(prepare_dataset(tiny_config([f"data.root={data_root}"]).data))


@pytest.fixture(scope="session")
def process_group():
    """A one-process gloo group for in-process sharding tests (fit() reuses it, never closes it)."""
    from recsys.distributed.env import destroy_distributed, init_distributed

    env = init_distributed("cpu", "gloo")
    yield env
    destroy_distributed()
