"""One value per default: what the config groups' YAML gives a plain run equals the dataclass defaults of
recsys/config.py, so that a test or script building ``Config()`` trains what ``python -m recsys.train`` trains.

The data group is the exception by design: ``data`` picks a dataset and its protocol (synthetic, recbole's
profile bag), and the dataclass holds the neutral values every dataset starts from. Tables exist only in YAML.
"""

from dataclasses import asdict
from pathlib import Path

from hydra import compose, initialize_config_dir

from recsys.config import Config, register_configs, to_config

CONF = Path(__file__).resolve().parents[1] / "conf"
CHOSEN_BY_GROUPS = ("data", "model.tables", "sharding.tables")


def _leaves(value, path: str = ""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _leaves(inner, f"{path}.{key}" if path else key)
    else:
        yield path, value


def test_the_yaml_defaults_are_the_dataclass_defaults():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = asdict(to_config(compose(config_name="config")))
    dataclass = dict(_leaves(asdict(Config())))
    differ = {
        path: (value, dataclass.get(path, "<missing>"))
        for path, value in _leaves(composed)
        if not path.startswith(CHOSEN_BY_GROUPS) and dataclass.get(path, "<missing>") != value
    }
    assert differ == {}, f"YAML vs recsys/config.py defaults (make them one value): {differ}"
