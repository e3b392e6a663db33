"""The weights' fingerprint (recsys/config/fingerprint.py): every data / model field is classified, the explicit rules
hash as the rules of every earlier version did, and a run dir written by an earlier main still loads."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recsys.config import Config, query_uses_neighbors
from recsys.config.fingerprint import FIELDS, config_fingerprint, fingerprint_values
from recsys.rundir.config import load_run_config
from recsys.rundir.saved_config import read_config_file
from tests.helpers.config import tiny_config

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "run_dir_2026_12_02"
)  # tiny run, written by main at ffa3d89
OPEN_SECTIONS = (
    "model.tables",
    "model.features",
    "data.interactions.md5",
    "data.interactions.items_columns",
    "data.interactions.users_columns",
    "model.managed.zch_size",
    "model.loss",  # the chosen loss's name, or a section of it and the settings it hashes (its own keys)
)
# fields added after the rules became a table: the earlier rules never saw them (their defaults leave the hash)
NEWER_FIELDS = {"data": ("slices", "slice", "slice_window"), "model": ("id_mapping", "managed", "item_bias")}
NEWER_SYNTHETIC = ("churn_periods", "item_lifetime_periods")
NEWER_INTERACTIONS = ("valid_carve",)


def _leaves(values: dict, path: str = ""):
    for key, value in values.items():
        here = f"{path}.{key}" if path else key
        if isinstance(value, dict) and here not in OPEN_SECTIONS:
            yield from _leaves(value, here)
        else:
            yield here


def test_every_data_and_model_field_is_classified():
    assert set(_leaves(fingerprint_values(Config()))) == set(FIELDS), (
        "add the new field to recsys/config/fingerprint.py's FIELDS: HASH, SKIP or Absent"
    )


def legacy_fingerprint(cfg: Config) -> str:
    """The rules as code, before they were a table (main up to 2026-12-02): what every saved run was hashed with."""
    data, model = asdict(cfg.data), asdict(cfg.model)
    loss = model.pop("loss")  # before losses were components: flat fields, all five whatever the loss
    model.update({"temperature": 0.1, "logq_correction": True, "logq_weight": 1.0, "margin": 0.9})
    model.update({"negative_weight": 150.0, "loss": loss.pop("name")})
    assert loss.pop("uniformity_weight", 0.0) == 0.0  # added after the table: the earlier rules never saw it
    assert loss.pop("mask_history", False) is False  # likewise
    model.update({k: v for k, v in loss.items() if k != "block_mb"})
    negatives = model.pop("negatives")  # model.num_uniform_negatives before; only uniform draws then
    assert negatives["exponent"] == 0.0
    model["num_uniform_negatives"] = negatives["num"]
    encoder = model.pop("query_encoder")  # before query encoders were components: a name and sasrec's section
    model["query_encoder"] = encoder.pop("name")
    model["sasrec"] = encoder or {"dim": 64, "num_layers": 2, "num_heads": 1, "dropout": 0.2}
    for section, keys in (("data", NEWER_FIELDS["data"]), ("model", NEWER_FIELDS["model"])):
        for key in keys:
            (data if section == "data" else model).pop(key)
    for key in NEWER_SYNTHETIC:
        data["synthetic"].pop(key)
    for key in NEWER_INTERACTIONS:
        data["interactions"].pop(key)
    data.pop("root")
    data.pop("shard_by_user")
    data["interactions"].pop("memory_budget_mb")
    for key in ("id_type", "timestamp_unit"):
        if data["interactions"][key] == "auto":
            del data["interactions"][key]
    for side in ("items_columns", "users_columns"):
        if not data["interactions"][side]:
            del data["interactions"][side]
    if not data["synthetic"]["num_user_groups"]:
        del data["synthetic"]["num_user_groups"]
    if not model["features"]:
        del model["features"]
    if not data["train_on_valid"]:
        del data["train_on_valid"]
    if not data["item_neighbors"]:
        del data["item_neighbors"]
        model["tables"].pop("neighbor", None)
    model["query_neighbors"] = query_uses_neighbors(cfg)
    if not model["query_neighbors"]:
        del model["query_neighbors"]
    if model["query_encoder"] == "bag":
        del model["query_encoder"], model["sasrec"]
    return hashlib.sha256(json.dumps({"data": data, "model": model}, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["data.item_neighbors=0"],
        ["data.train_on_valid=true", "data.shard_by_user=true", "data.root=elsewhere"],
        ["data.protocol=loo", "data.query_history=recent", "model/query_encoder=sasrec", "model.query_encoder.dim=8"],
        [
            "data.protocol=loo",
            "data.query_history=recent",
            "model/query_encoder=sasrec",
            "model.query_encoder.num_layers=1",
            "model.query_encoder.dropout=0.1",
            "model/loss=ccl",
        ],
        ["model.query_neighbors=false", "data.synthetic.num_user_groups=3"],
        ["model.loss.temperature=0.2", "model.loss.block_mb=8"],
        ["model/loss=ccl", "model.loss.margin=0.5"],
        ["model.negatives.num=8"],
        ["data=gowalla"],
        ["data=interactions", "data.interactions.path=x.csv", "data.interactions.id_type=string"],
        ["data=interactions", "data.interactions.path=x.csv", "data.interactions.timestamp_unit=ms"],
        ["data=movielens_1m", "data/protocol=strong_generalization"],
    ],
)
def test_the_table_hashes_as_the_earlier_rules_did(overrides):
    cfg = tiny_config(
        [*overrides, "model.item_bias=false", "model.loss.mask_history=false"]
    )  # the earlier rules' models
    assert config_fingerprint(cfg) == legacy_fingerprint(cfg)
    # the item bias (null: on with the softmax) is another model: another fingerprint
    with_bias = tiny_config([*overrides, "model.item_bias=null"])
    assert (config_fingerprint(with_bias) != config_fingerprint(cfg)) == with_bias.model.uses_item_bias


def test_where_and_how_rows_are_read_change_nothing_and_what_is_trained_does():
    base = config_fingerprint(tiny_config([]))
    assert config_fingerprint(tiny_config(["data.root=/else", "data.shard_by_user=true"])) == base
    assert config_fingerprint(tiny_config(["model.loss.temperature=0.2"])) != base
    assert config_fingerprint(tiny_config(["model.loss.uniformity_weight=0.5"])) != base
    assert config_fingerprint(tiny_config(["model.loss.mask_history=false"])) != base
    assert config_fingerprint(tiny_config(["data.split_seed=3"])) != base


def test_a_run_dir_written_by_an_earlier_main_still_loads(tmp_path):
    """Its config (from before the issue-28 id fields and the rankers' eval keys) merges into today's schema and
    hashes to the fingerprint its weights were saved with: evaluate / export / init_from accept it."""
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    saved = json.loads((run_dir / "checkpoints" / "best" / "trainer_state.json").read_text())["fingerprint"]
    cfg = load_run_config(run_dir)
    assert config_fingerprint(cfg) == saved


def test_an_older_sasrec_run_reads_as_the_same_encoder_and_hash(tmp_path):
    """The fixture's config as an older sasrec run saved it (model.query_encoder: sasrec, model.sasrec: {...}) reads
    as the sasrec component with those settings, and hashes as main did before query encoders were components."""
    saved = OmegaConf.load(FIXTURE / ".hydra" / "config.yaml")
    assert saved.model.query_encoder == "bag" and "sasrec" in saved.model  # the older layout
    saved.model.query_encoder, saved.model.sasrec.dim, saved.model.sasrec.num_layers = "sasrec", 32, 1
    saved.data.protocol, saved.data.query_history = "loo", "recent"
    OmegaConf.save(saved, tmp_path / "config.yaml")
    cfg = read_config_file(tmp_path / "config.yaml")
    assert (cfg.model.query_encoder.name, cfg.model.query_encoder.dim, cfg.model.query_encoder.num_layers) == (
        "sasrec",
        32,
        1,
    )
    assert config_fingerprint(cfg) == "1fef74ba2cf8209c"  # main's, before query encoders were components
    assert read_config_file(FIXTURE / ".hydra" / "config.yaml").model.query_encoder.name == "bag"
