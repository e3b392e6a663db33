"""One value per default: what the config groups' YAML gives a plain run equals the dataclass defaults of
recsys/config/, so that a test or script building ``Config()`` trains what ``python -m recsys.train`` trains.

Each ranker's settings (``eval.settings.<name>``, conf/eval/rankers/) equal its package's dataclass defaults.
The data group is the exception by design: ``data`` picks a dataset and its protocol (synthetic, recbole's
profile bag), and the dataclass holds the neutral values every dataset starts from. Tables exist only in YAML.
"""

from dataclasses import asdict
from pathlib import Path

from hydra import compose, initialize_config_dir

from recsys.config import Config, register_configs, to_config
from recsys.rankers.registry import COMBINATORS, ranker_specs

CONF = Path(__file__).resolve().parents[2] / "conf"
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
    # each ranker's settings (eval.settings.<name>) default to its package's dataclass (recsys/rankers/registry.py)
    for name in composed["eval"]["settings"]:
        spec = {**ranker_specs(), **COMBINATORS}[name]
        dataclass |= dict(_leaves(asdict(spec.settings()), f"eval.settings.{name}"))
    differ = {
        path: (value, dataclass.get(path, "<missing>"))
        for path, value in _leaves(composed)
        if not path.startswith(CHOSEN_BY_GROUPS) and dataclass.get(path, "<missing>") != value
    }
    assert differ == {}, f"YAML vs recsys/config/ defaults (make them one value): {differ}"


def test_a_protocol_changes_the_split_and_only_the_query_features_its_resolution_logs(caplog):
    """data/protocol=loo against the recbole default, on MovieLens: the split settings differ, and the query's
    features differ exactly where the protocol filled them in, which the start-of-run line names."""
    import logging

    from omegaconf import OmegaConf

    from recsys.config import PROTOCOL_QUERY, Protocol

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        with caplog.at_level(logging.INFO, logger="recsys.config"):
            recbole = asdict(to_config(compose(config_name="config", overrides=["data=movielens_1m"])))
            caplog.clear()
            loo = asdict(to_config(compose(config_name="config", overrides=["data=movielens_1m", "data/protocol=loo"])))
        line = caplog.records[-1].getMessage()
        split_files = {
            name: set(OmegaConf.load(CONF / "data" / "protocol" / f"{name}.yaml")) for name in ("recbole", "loo")
        }
    changed = {path for path, value in _leaves(loo) if dict(_leaves(recbole))[path] != value}
    query = {f"data.{key}" for key in PROTOCOL_QUERY[Protocol.loo]}
    split = {f"data.{key}" for key in split_files["loo"] | split_files["recbole"]}
    assert changed - split == {p for p in query if dict(_leaves(loo))[p] != dict(_leaves(recbole))[p]}
    assert changed & query == {
        "data.query_history",
        "data.history_length",
        "data.history_dropout",
        "data.item_neighbors",
    }
    assert line == (
        "query: the 20 items just before the target; candidate: the item (protocol loo; from the protocol: "
        "data.query_history, data.history_length, data.history_dropout, data.item_neighbors)"
    )
