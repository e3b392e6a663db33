"""The fingerprint of a run's weights: a hash of the data and model settings they depend on, saved with every
checkpoint and compared before resuming, initialising from, evaluating or exporting it.

``FIELDS`` lists every field of ``data`` and ``model`` (recsys/config/) with how it enters the hash:

- ``HASH``: what is trained depends on it;
- ``SKIP``: where or how the rows are read, not which (a run may move or read them otherwise and resume);
- ``Absent(value)``: a field added after runs existed; hashed only when it differs from the value every
  earlier run had, so their run dirs keep their fingerprint (``Absent(value, unless=...)``: also left out
  while another setting makes it unused).

A new field must be added here (tests/config/test_fingerprint.py fails until it is). ``FINGERPRINT_VERSION`` says
which rules a saved fingerprint was made with; changing a rule so that existing runs hash otherwise means a
new version and a note in the refusal. Run dirs written at version 1 are tested (tests/fixtures/).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from omegaconf import OmegaConf

from recsys.config.data import DataConfig
from recsys.config.model import IdMapping, ModelConfig
from recsys.config.run import Config, query_uses_neighbors

FINGERPRINT_VERSION = 1

HASH, SKIP = "hash", "skip"


@dataclass(frozen=True)
class Absent:
    """Hashed only when the value differs from ``value`` (and ``unless`` is not true of the config)."""

    value: Any
    unless: Callable[[dict], bool] | None = None  # the field is unused, whatever its value


def _no_neighbours(values: dict) -> bool:
    return not values["data"]["item_neighbors"]


def _not_sasrec(values: dict) -> bool:
    return values["model"]["query_encoder"] != "sasrec"


def _no_slices(values: dict) -> bool:
    return not values["data"]["slices"]


def _no_churn(values: dict) -> bool:
    return not values["data"]["synthetic"]["churn_periods"]


def _vocab_ids(values: dict) -> bool:
    return values["model"]["id_mapping"] == IdMapping.vocab


FIELDS: dict[str, object] = {
    **{f"data.{k}": HASH for k in ("name", "source", "protocol", "split_seed", "history_length", "query_history")},
    **{f"data.{k}": HASH for k in ("history_dropout", "min_rating", "min_user_interactions", "min_item_interactions")},
    "data.num_heldout_users": HASH,
    "data.root": SKIP,  # where prepared dataset dirs live
    "data.shard_by_user": SKIP,  # how the rows are read, not which
    "data.item_neighbors": Absent(0),
    "data.train_on_valid": Absent(False),
    "data.slices": Absent(0),  # the continuous-training replay (docs/continuous-training.md)
    **{f"data.{k}": Absent(None, unless=_no_slices) for k in ("slice", "slice_window")},
    **{f"data.synthetic.{k}": HASH for k in ("num_users", "num_items", "num_categories", "num_interactions")},
    **{f"data.synthetic.{k}": HASH for k in ("latent_dim", "min_interactions_per_user", "seed")},
    "data.synthetic.num_user_groups": Absent(0),
    "data.synthetic.churn_periods": Absent(0),
    "data.synthetic.item_lifetime_periods": Absent(None, unless=_no_churn),
    **{f"data.movielens.{k}": HASH for k in ("release", "url", "md5", "download")},
    **{f"data.interactions.{k}": HASH for k in ("path", "train_path", "valid_path", "test_path", "format")},
    **{f"data.interactions.{k}": HASH for k in ("delimiter", "header", "user_column", "item_column")},
    **{f"data.interactions.{k}": HASH for k in ("timestamp_column", "rating_column", "valid_fraction", "md5")},
    **{f"data.interactions.{k}": HASH for k in ("items_path", "items_id_column", "categories_column")},
    **{f"data.interactions.{k}": HASH for k in ("categories_separator", "users_path", "users_id_column")},
    "data.interactions.memory_budget_mb": SKIP,  # how the log is prepared, not what is written
    "data.interactions.id_type": Absent("auto"),
    "data.interactions.timestamp_unit": Absent("auto"),
    "data.interactions.valid_carve": Absent("random"),  # which train rows are valid: another split when latest
    "data.interactions.items_columns": Absent({}),
    "data.interactions.users_columns": Absent({}),
    "model.tables": HASH,  # the neighbour table's settings only with neighbours (``_tables``)
    "model.features": Absent({}),
    # the loss's settings as the flat fields they were before losses became components (``_flat_loss``)
    **{f"model.{k}": HASH for k in ("tower_dims", "temperature", "logq_correction", "logq_weight")},
    **{f"model.{k}": HASH for k in ("num_uniform_negatives", "loss", "margin", "negative_weight", "query_user_id")},
    "model.negative_exponent": Absent(0.0),  # model.negatives.exponent
    "model.query_neighbors": Absent(False),  # resolved first: null and true build the same model
    "model.item_bias": Absent(False),  # resolved first (the candidate's last output as the item's logit bias)
    # the query encoder as the name and sasrec section it was before encoders were components (``_flat_query_encoder``;
    # runs then had bag or sasrec: "unless bag" was "unless not sasrec")
    "model.query_encoder": Absent("bag"),
    **{f"model.sasrec.{k}": Absent(None, unless=_not_sasrec) for k in ("dim", "num_layers", "num_heads", "dropout")},
    "model.id_mapping": Absent(IdMapping.vocab),
    **{
        f"model.managed.{k}": Absent(None, unless=_vocab_ids)
        for k in ("zch_size", "eviction_policy", "eviction_interval", "decay_exponent")
    },
}


def _get(values: dict, path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def _put(out: dict, path: str, value: Any) -> None:
    *sections, key = path.split(".")
    for section in sections:
        out = out.setdefault(section, {})
    out[key] = value


# The model fields the two first losses' settings were, with their defaults then: every saved run hashed all five
LEGACY_LOSS_FIELDS = {
    "temperature": 0.1,
    "logq_correction": True,
    "logq_weight": 1.0,
    "margin": 0.9,
    "negative_weight": 150.0,
}
LOSS_SKIPPED = ("block_mb",)  # how the loss is computed (row blocks or whole), not what
# settings a loss gained after runs existed, with the value every earlier run had: hashed only when they differ
LOSS_ADDED = {"uniformity_weight": 0.0, "mask_history": False}


def _flat_loss(loss: dict) -> dict:
    """``model.loss``'s section as model fields: the settings named as a legacy field in that field, ``loss`` the
    name (softmax, ccl: their hash is unchanged) or, with settings of its own, a section of the name and those."""
    settings = {
        k: v
        for k, v in loss.items()
        if k != "name" and k not in LOSS_SKIPPED and not (k in LOSS_ADDED and v == LOSS_ADDED[k])
    }
    own = {k: v for k, v in settings.items() if k not in LEGACY_LOSS_FIELDS}
    legacy = {k: v for k, v in settings.items() if k in LEGACY_LOSS_FIELDS}
    return {**LEGACY_LOSS_FIELDS, **legacy, "loss": {"name": loss["name"], **own} if own else loss["name"]}


# model.sasrec's fields before query encoders were components, with their defaults then (hashed with sasrec only)
LEGACY_SASREC = {"dim": 64, "num_layers": 2, "num_heads": 1, "dropout": 0.2}


def _flat_query_encoder(encoder: dict) -> dict:
    """``model.query_encoder``'s section as the model fields it was: ``query_encoder`` the name (bag, sasrec: their
    hash is unchanged) or, for another encoder with settings, a section of the name and those; ``sasrec`` sasrec's
    settings (or, for another encoder, the defaults then, which its hash leaves out)."""
    name = encoder["name"]
    settings = {k: v for k, v in encoder.items() if k != "name"}
    if name == "sasrec":
        return {"query_encoder": name, "sasrec": settings}
    return {"query_encoder": {"name": name, **settings} if settings else name, "sasrec": dict(LEGACY_SASREC)}


def fingerprint_values(cfg: Config) -> dict:
    """The data and model fields as ``FIELDS`` classifies them (the loss and the query encoder flattened:
    ``_flat_loss``, ``_flat_query_encoder``)."""
    values = {"data": asdict(cfg.data), "model": asdict(cfg.model)}
    values["model"].update(_flat_loss(values["model"].pop("loss")))
    negatives = values["model"].pop("negatives")  # num was model.num_uniform_negatives: its hash is unchanged
    values["model"].update(num_uniform_negatives=negatives["num"], negative_exponent=negatives["exponent"])
    values["model"].update(_flat_query_encoder(values["model"].pop("query_encoder")))
    return values


def config_fingerprint(cfg: Config) -> str:
    """What the weights depend on (data and model, by ``FIELDS``), not where or how they are trained."""
    values = fingerprint_values(cfg)
    values["model"]["query_neighbors"] = query_uses_neighbors(cfg)
    values["model"]["item_bias"] = cfg.model.uses_item_bias  # resolved: null and its value build the same model
    if _no_neighbours(values):  # the unused neighbour table's settings change no weight
        values["model"]["tables"].pop("neighbor", None)
    kept: dict = {}
    for path, rule in FIELDS.items():
        value = _get(values, path)
        if rule == SKIP:
            continue
        if isinstance(rule, Absent) and (value == rule.value or (rule.unless is not None and rule.unless(values))):
            continue
        _put(kept, path, value)
    blob = json.dumps(kept, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def weights_fingerprint(cfg: Config) -> str:
    """What the weights' shapes and meaning depend on: ``config_fingerprint`` without the choice of slice
    (data.slice, data.slice_window), which changes the rows trained on, not the model. trainer.init_from compares it,
    so that one slice's run starts from the previous slice's weights (docs/continuous-training.md)."""
    if not cfg.data.slices:
        return config_fingerprint(cfg)
    return config_fingerprint(replace(cfg, data=replace(cfg.data, slice=0, slice_window=1)))


@dataclass(frozen=True)
class RunIdentity:
    """What a run's checkpoints are saved with and compared against (recsys/rundir/manager.py), derived once from the
    run's config by its assembly: the fingerprints, the data and model sections, the whole config as YAML."""

    fingerprint: str  # config_fingerprint: resuming needs the same
    weights_fingerprint: str  # weights_fingerprint: a warm start (trainer.init_from) needs the same
    data: DataConfig
    model: ModelConfig
    config_yaml: str  # every checkpoint's config.yaml


def run_identity(cfg: Config) -> RunIdentity:
    return RunIdentity(
        fingerprint=config_fingerprint(cfg),
        weights_fingerprint=weights_fingerprint(cfg),
        data=cfg.data,
        model=cfg.model,
        config_yaml=OmegaConf.to_yaml(OmegaConf.structured(cfg)),
    )
