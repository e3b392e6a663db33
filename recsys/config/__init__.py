"""Typed configuration schemas of every entry point, and their registration with Hydra.

Only the entry points (``recsys.train``, ``recsys.evaluate``, ``recsys.export``,
``scripts/plan_sharding.py``, ``data_pipelines.prepare``) see a Hydra ``DictConfig``; each calls
:func:`register_configs` first and turns the composed config into these dataclasses with
``to_typed`` (:func:`to_config` for the training config, which also checks values). A typo in any
key (``trainer.epoch=3``) or a name outside its set (``data.protocol=lo``) fails at start-up with
the key's full path, before any work is done.

Required values are ``???`` (``MISSING``), never ``None``. One module per section, each with its
checks beside its dataclass::

    model.py         model.*                          check_model
    moved_keys.py    keys that moved: a command line naming one is refused with the new place (refuse_moved_keys)
    training.py      optim.*, sharding.*, trainer.*   check_optim, check_trainer
    evaluation.py    eval.*                           check_eval
    tune.py          tune.*                           check_tune
    data.py          data.*: the pipelines' settings (data_pipelines/config.py) and the trainer's (the query's history...)
    run.py           Config, what the sections imply together
                     (the query's features), check_data, check_values (every section's
                     checks)
    fingerprint.py   the hash of the data and model settings the weights depend on; the run's identity (RunIdentity)
    need.py          the collector the checks report to
    entry_points.py  recsys.evaluate / recsys.export / plan schemas, register_configs

Import every name from ``recsys.config``; the modules are its layout, not its interface (``fingerprint.py`` aside:
the run's identity, imported by its own path where a run dir is opened).
"""

from data_pipelines.config import (  # the pipelines' data schema is part of Config's (recsys.config.data)
    Choice,
    InteractionsDataConfig,
    MovieLensDataConfig,
    Protocol,
    Source,
    SyntheticDataConfig,
    reject_unknown_keys,
    to_typed,
)
from recsys.config.data import DataConfig, QueryHistory
from recsys.config.entry_points import (
    ClusterConfig,
    EvaluateConfig,
    ExportConfig,
    PlanConfig,
    TableRowsConfig,
    register_configs,
    schema,
)
from recsys.config.evaluation import (
    VALID_METRICS,
    EvalConfig,
)
from recsys.config.model import (
    FEATURE_SOURCES,
    POOLINGS,
    TOWERS,
    EvictionPolicy,
    FeatureConfig,
    IdMapping,
    ManagedConfig,
    ModelConfig,
    NegativesConfig,
    TableConfig,
)
from recsys.config.moved_keys import refuse_moved_keys
from recsys.config.run import (
    PROTOCOL_QUERY,
    Config,
    check_values,
    describe_query,
    query_layout,
    query_not_exportable,
    query_uses_neighbors,
    query_uses_user_id,
    resolve_protocol,
    to_config,
    uses_sequence_encoder,
    value_at,
    with_values,
)
from recsys.config.training import (
    PIPELINES,
    PRECISIONS,
    Backend,
    DenseOptimConfig,
    DenseOptimizer,
    Device,
    OptimConfig,
    ShardingConfig,
    SparseOptimConfig,
    SparseOptimizer,
    TableShardingConfig,
    TrainerConfig,
)
from recsys.config.tune import KnobConfig, TuneConfig

__all__ = [
    "FEATURE_SOURCES",
    "PIPELINES",
    "POOLINGS",
    "PRECISIONS",
    "PROTOCOL_QUERY",
    "TOWERS",
    "VALID_METRICS",
    "Backend",
    "Choice",
    "ClusterConfig",
    "Config",
    "DataConfig",
    "DenseOptimConfig",
    "DenseOptimizer",
    "Device",
    "EvalConfig",
    "EvaluateConfig",
    "EvictionPolicy",
    "ExportConfig",
    "FeatureConfig",
    "IdMapping",
    "InteractionsDataConfig",
    "ManagedConfig",
    "ModelConfig",
    "NegativesConfig",
    "MovieLensDataConfig",
    "OptimConfig",
    "PlanConfig",
    "Protocol",
    "QueryHistory",
    "ShardingConfig",
    "Source",
    "SparseOptimConfig",
    "SparseOptimizer",
    "SyntheticDataConfig",
    "TableConfig",
    "TableRowsConfig",
    "TableShardingConfig",
    "TrainerConfig",
    "check_values",
    "describe_query",
    "query_layout",
    "query_uses_neighbors",
    "query_not_exportable",
    "query_uses_user_id",
    "refuse_moved_keys",
    "reject_unknown_keys",
    "register_configs",
    "schema",
    "resolve_protocol",
    "to_config",
    "value_at",
    "with_values",
    "KnobConfig",
    "TuneConfig",
    "to_typed",
    "uses_sequence_encoder",
]
