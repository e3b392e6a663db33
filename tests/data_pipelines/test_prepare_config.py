"""``python -m data_pipelines.prepare`` composes the training config tree and types only the pipelines' data keys
(data_pipelines.config.pipeline_data); the trainer's keys (recsys.config.data) are named, not read."""

import pytest
from omegaconf import OmegaConf

from data_pipelines.config import DataConfig, Protocol, pipeline_data
from data_pipelines.errors import ConfigError


def test_the_pipelines_keys_are_typed_and_the_trainers_named():
    section = OmegaConf.create(
        {"name": "toy", "protocol": "loo", "split_seed": 3, "history_length": 50, "item_neighbors": 20}
    )
    data, left = pipeline_data(section)
    assert type(data) is DataConfig
    assert (data.name, data.protocol, data.split_seed) == ("toy", Protocol.loo, 3)
    assert left == ["data.history_length", "data.item_neighbors"]
    assert not hasattr(data, "history_length")


def test_a_bad_pipeline_value_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"'lo'.*data\.protocol"):
        pipeline_data(OmegaConf.create({"name": "toy", "protocol": "lo"}))
    with pytest.raises(ConfigError, match="data.name"):
        pipeline_data(OmegaConf.create({"protocol": "loo"}))  # required, never set
