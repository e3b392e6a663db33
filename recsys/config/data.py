"""The ``data`` section of the training config: the data pipelines' settings (``data_pipelines.config.DataConfig``:
which dataset, how it is split) and the ones only the trainer reads (the query's history, the candidates'
neighbours, what is trained on, how the rows are spread over ranks).

The pipelines prepare a dataset dir from their own fields alone; ``python -m data_pipelines.prepare`` composes the
same tree and leaves these to the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

from data_pipelines.config import Choice
from data_pipelines.config import DataConfig as PipelineDataConfig


class QueryHistory(Choice):
    """Which items a training query sees (docs/your-own-data.md, "Protocols")."""

    recent = "recent"
    profile = "profile"


@dataclass
class DataConfig(PipelineDataConfig):
    # The query's features below are the model's, not the split's: null takes what the protocol implies
    # (recsys.config.PROTOCOL_QUERY, resolved in one place and logged at the start of a run); a dataset or the
    # command line may set them.
    history_length: int | None = (
        None  # cap on the items a query's history bag holds (history_item_ids); 0 disables history features
    )
    # which items a training query sees (docs/your-own-data.md, "Protocols"):
    # "recent": the history_length items just before the target in time (sequential protocols, loo);
    # "profile": up to history_length of the user's OTHER training items, resampled every epoch, the
    # target never among them (random splits: recbole, given, strong_generalization)
    query_history: QueryHistory | None = None
    history_dropout: float | None = (
        None  # profile: share of the bag left out at random each epoch (training only); 0 keeps min(cap, n - 1)
    )
    # the candidate tower's co-occurrence neighbours (recsys/data/neighbors.py): each item's this many
    # best co-occurring training items, mean-pooled from table `neighbor`; 0 turns the feature off
    item_neighbors: int | None = None
    # true: the valid split's rows are trained on too, there is no validation, trainer.epochs is the
    # number of epochs and the last epoch's weights are tested (the refit after model selection:
    # trainer.refit sets it for its second stage; docs/evaluation.md, "Refit on train and valid")
    train_on_valid: bool = False
    # true: each rank reads only its own users' rows (contiguous user ranges of ~equal training rows)
    # and trains / evaluates on them, instead of every rank holding the whole dataset; the epoch's
    # order then depends on the world size (docs/training-at-scale.md, "Data across ranks")
    shard_by_user: bool = False
    # the continuous-training replay (recsys/data/slices.py, docs/continuous-training.md): the whole log (every
    # split's rows) cut by time into this many equal windows; a run trains on window data.slice, with the earlier
    # windows as its users' history, and tests on the next window (no validation split: data.train_on_valid=true);
    # 0 = the protocol's own splits
    slices: int = 0
    slice: int = 0  # the window trained on, 0-based: 0 .. data.slices - 2 (the next one is its test)
    # windows up to data.slice whose rows are training examples: 1 = data.slice alone (an incremental run, warm-started
    # with trainer.init_from), 0 = all of 0 .. data.slice (retraining from scratch on all data so far)
    slice_window: int = 1
