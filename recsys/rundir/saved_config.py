"""A run's saved config (.hydra/config.yaml, a checkpoint's config.yaml) as this code reads it: what earlier runs
wrote is brought to today's schema first (keys retired, sections moved), none of which changes what was trained."""

from __future__ import annotations

from omegaconf import OmegaConf

from recsys.config import Config, schema, to_config

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


def read_config_file(path) -> Config:
    """A run's saved config (.hydra/config.yaml or a checkpoint's config.yaml), as this code reads it."""
    saved_cfg = OmegaConf.load(path)
    if "model" in saved_cfg and "query_neighbors" not in saved_cfg.model:
        # written before model.query_neighbors existed: those models' queries did not read the neighbour table
        saved_cfg.model.query_neighbors = False
    drop_retired_keys(saved_cfg)
    move_ranker_settings(saved_cfg)
    nest_flat_loss(saved_cfg)
    model = OmegaConf.select(saved_cfg, "model")
    if model is not None and "num_uniform_negatives" in model:  # now model.negatives.num (uniform: exponent 0)
        model.negatives = {"num": model.pop("num_uniform_negatives")}
    nest_query_encoder(saved_cfg)
    return to_config(OmegaConf.merge(schema(Config), saved_cfg))
