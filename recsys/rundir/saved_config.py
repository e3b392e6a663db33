"""A run's saved config (.hydra/config.yaml, a checkpoint's config.yaml) as this code reads it: what earlier runs
wrote is brought to today's schema first (keys retired, sections moved), none of which changes what was trained."""

from __future__ import annotations

from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_pipelines.errors import one_line
from recsys.config import Config, schema, to_config
from recsys.utils.safe_load import UnreadableFile, UnsafeFileError

# eval keys of runs from before the rankers (the dense graph filter's): evaluation settings, not the weights'
RETIRED_KEYS = {"eval.graph_filter": ("enabled", "betas", "max_pairs", "memory_gb")}


def drop_retired_keys(saved_cfg) -> None:
    """Remove keys an older run's config holds that this code no longer has (none changes what was trained)."""
    for section, keys in RETIRED_KEYS.items():
        node = OmegaConf.select(saved_cfg, section)
        if node is not None:
            for key in keys:
                node.pop(key, None)


# eval sections of runs from before each ranker kept its settings under eval.settings.<name>
MOVED_TO_SETTINGS = ("graph_filter", "fusion")


def move_ranker_settings(saved_cfg) -> None:
    """An older run's eval.graph_filter / eval.fusion moved to where rankers keep their settings (eval.settings)."""
    node = OmegaConf.select(saved_cfg, "eval")
    if node is None:
        return
    for name in MOVED_TO_SETTINGS:
        if name in node:
            if "settings" not in node:
                node.settings = {}
            node.settings[name] = node.pop(name)


# model fields of runs from before losses were components (recsys/model/losses), by the loss that read them
FLAT_LOSS_FIELDS = {
    "softmax": {"temperature": "temperature", "logq_correction": "logq_correction", "logq_weight": "logq_weight"},
    "ccl": {"margin": "margin", "negative_weight": "negative_weight"},
}
FLAT_LOSS_ONLY = {"softmax": {"softmax_block_mb": "block_mb"}}


def nest_flat_loss(saved_cfg) -> None:
    """An older run's model.loss (a name) and its flat settings (model.temperature, model.margin, ...) as the loss's
    section, model.loss.*: the same loss with the same settings."""
    model = OmegaConf.select(saved_cfg, "model")
    if model is None or not isinstance(model.get("loss", None), str):
        return
    name = model.pop("loss")
    fields = {**FLAT_LOSS_FIELDS.get(name, {}), **FLAT_LOSS_ONLY.get(name, {})}
    section = {"name": name}
    for old in [*FLAT_LOSS_FIELDS["softmax"], *FLAT_LOSS_FIELDS["ccl"], *FLAT_LOSS_ONLY["softmax"]]:
        if old in model:
            value = model.pop(old)
            if old in fields:
                section[fields[old]] = value
    model.loss = section


def nest_query_encoder(saved_cfg) -> None:
    """An older run's model.query_encoder (a name: bag or sasrec) and its model.sasrec section as the encoder's
    section, model.query_encoder.*: sasrec's settings under sasrec, the (unused) section dropped under bag."""
    model = OmegaConf.select(saved_cfg, "model")
    if model is None:
        return
    sasrec = model.pop("sasrec", None)
    if not isinstance(model.get("query_encoder", None), str):
        return
    name = model.pop("query_encoder")
    model.query_encoder = {"name": name, **(OmegaConf.to_container(sasrec) if name == "sasrec" and sasrec else {})}


def load_config_yaml(path: Path) -> DictConfig:
    """A YAML config file recsys wrote (a run's config.yaml), with OmegaConf's safe loader: a Python tag or any other
    YAML that is not a plain mapping is refused naming the file, and nothing in it is built."""
    try:
        cfg = OmegaConf.load(path)
    except yaml.constructor.ConstructorError as e:  # a tag a plain mapping never holds (!!python/object/apply...)
        where = f", line {e.problem_mark.line + 1}" if e.problem_mark else ""
        raise UnsafeFileError(_not_config_yaml(path, f"{e.problem}{where}")) from None
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        raise UnreadableFile(_not_config_yaml(path, " ".join(str(e).split()))) from None
    if not isinstance(cfg, DictConfig):
        raise UnreadableFile(_not_config_yaml(path, f"a {type(cfg).__name__}, not a mapping of sections"))
    return cfg


def _not_config_yaml(path: Path, reason: str) -> str:
    return (
        f"{path}: not valid config YAML ({reason}); not a config recsys wrote (a crafted or damaged file?), nothing "
        "in it was built or run. Restore the run's config (its checkpoint's config.yaml or .hydra/config.yaml)"
    )


def read_config_file(path) -> Config:
    """A run's saved config (.hydra/config.yaml or a checkpoint's config.yaml), as this code reads it: a file that is
    not a config (a Python tag, not YAML, other types than the schema's) is one refusal naming it."""
    saved_cfg = load_config_yaml(Path(path))
    try:
        merged = OmegaConf.merge(schema(Config), to_todays_keys(saved_cfg))
    except (OmegaConfBaseException, TypeError, AttributeError) as e:  # a section of another shape than the schema's
        reason = f"{e.full_key}: {e.msg}" if isinstance(e, OmegaConfBaseException) else f"{type(e).__name__}: {e}"
        raise UnreadableFile(
            f"{path}: not a config this code can read ({one_line(reason)}); restore the run's config (its checkpoint's "
            "config.yaml or .hydra/config.yaml)"
        ) from None
    return to_config(merged)


def to_todays_keys(saved_cfg):
    """An earlier run's saved config with today's keys (none of the moves changes what was trained)."""
    if "model" in saved_cfg and "query_neighbors" not in saved_cfg.model:
        # written before model.query_neighbors existed: those models' queries did not read the neighbour table
        saved_cfg.model.query_neighbors = False
    if "model" in saved_cfg and "item_bias" not in saved_cfg.model:
        # written before model.item_bias existed: those models' towers both ended unit vectors
        saved_cfg.model.item_bias = False
    drop_retired_keys(saved_cfg)
    move_ranker_settings(saved_cfg)
    nest_flat_loss(saved_cfg)
    model = OmegaConf.select(saved_cfg, "model")
    if model is not None and "loss" in model and "mask_history" not in model.loss:
        # written before model.loss.mask_history existed: those losses kept the query's history among the negatives
        model.loss.mask_history = False
    if model is not None and "num_uniform_negatives" in model:  # now model.negatives.num (uniform: exponent 0)
        model.negatives = {"num": model.pop("num_uniform_negatives")}
    nest_query_encoder(saved_cfg)
    return saved_cfg
