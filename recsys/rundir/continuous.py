"""Warm starts of continuous training: which checkpoint trainer.init_from names, and what may not change from it.

An incremental run (docs/continuous-training.md) starts from the previous slice's run::

    trainer.init_from=runs/day1 trainer.init_optimizer=true data.slice=2

``runs/day1`` is a run dir (its newest step checkpoint: the last epoch's weights, optimizer state and, with
model.id_mapping=managed, the remapping state) or a checkpoint dir. Refused, naming both values, before anything
loads: another id mapping, zch_size or eviction policy (the remapping state would not fit, or would mean another
thing); a managed checkpoint saved on N ranks loaded on M that do not divide N (torchrec rebuilds a rank's key
range only from whole saved ranges); a slice that does not come after the source's (its time range would overlap
or precede the one the weights were trained through). The same managed checks guard trainer.resume.
"""

from __future__ import annotations

import logging
from pathlib import Path

from recsys.config import Config, DataConfig, IdMapping, ModelConfig
from recsys.data.dataset import RetrievalData
from recsys.data.slices import slice_range
from recsys.rundir.checkpoint import CONFIG_FILE, TrainerState, is_complete_checkpoint, latest_checkpoint
from recsys.rundir.saved_config import read_config_file
from recsys.utils.refusals import MissingPath, RunRefused

log = logging.getLogger(__name__)


def init_checkpoint(path: Path) -> Path:
    """trainer.init_from's checkpoint: ``path`` itself, or a run dir's newest complete step checkpoint."""
    if is_complete_checkpoint(path):
        return path
    newest = latest_checkpoint(path / "checkpoints")
    if newest is None:
        raise MissingPath(
            f"trainer.init_from={str(path)!r}: neither a complete checkpoint nor a run dir with one in checkpoints/"
        )
    return newest


def checkpoint_config(path: Path) -> Config | None:
    """The config a checkpoint was trained with (its config.yaml), or None for one saved without it."""
    file = path / CONFIG_FILE
    if not file.is_file():
        return None
    return read_config_file(file)


def check_managed(
    key: str, path: Path, was: ModelConfig, now: ModelConfig, saved_world_size: int, world_size: int
) -> None:
    """The remapping state of ``path`` (saved with the model section ``was``) can be loaded by this run's model
    section ``now``, or a refusal naming both."""
    if was.id_mapping != now.id_mapping:
        raise RunRefused(
            f"{key}={str(path)!r}: trained with model.id_mapping={was.id_mapping}, this run has "
            f"model.id_mapping={now.id_mapping}: the tables' rows mean other things"
        )
    if now.id_mapping != IdMapping.managed:
        return
    for table in sorted(set(was.managed.zch_size) | set(now.managed.zch_size)):
        a, b = was.managed.zch_size.get(table), now.managed.zch_size.get(table)
        if a != b:
            raise RunRefused(
                f"{key}={str(path)!r}: its managed tables have model.managed.zch_size.{table}={a}, this run "
                f"model.managed.zch_size.{table}={b}: the remapping state holds a row per slot; keep {a}"
            )
    if was.managed.eviction_policy != now.managed.eviction_policy:
        raise RunRefused(
            f"{key}={str(path)!r}: its managed tables were filled with model.managed.eviction_policy="
            f"{was.managed.eviction_policy}, this run has model.managed.eviction_policy={now.managed.eviction_policy}: "
            "the saved eviction metadata belongs to the first; keep it"
        )
    if saved_world_size % world_size:
        raise RunRefused(
            f"{key}={str(path)!r}: its managed tables were saved by {saved_world_size} ranks and this run has "
            f"{world_size}: torchrec rebuilds a rank's share of the remapping only from whole saved shares, so the "
            f"number of ranks must divide {saved_world_size}"
        )


def check_slice_order(path: Path, was: DataConfig, now: DataConfig, data: RetrievalData) -> None:
    """A warm start on the same replayed log (``was``: the source's data section, ``now``: this run's) must train on
    a later slice than its source, or be refused."""
    if not (was.slices and now.slices and data.slice_bounds is not None):
        return
    same_log = {**vars(was), "slice": 0, "slice_window": 0, "slices": 0, "root": ""} == {
        **vars(now),
        "slice": 0,
        "slice_window": 0,
        "slices": 0,
        "root": "",
    }
    if not same_log:
        return
    if was.slices == now.slices:
        before = slice_range(data.slice_bounds, was.slice, was.slice_window)
    else:  # other windows of the same log: the source's range from its own bounds
        from recsys.data.slices import slice_bounds  # noqa: PLC0415

        t_min, t_max = int(data.slice_bounds[0]), int(data.slice_bounds[-1]) - 1
        bounds = slice_bounds(_range_times(t_min, t_max), was.slices)
        before = slice_range(bounds, was.slice, was.slice_window)
    now_range = slice_range(data.slice_bounds, now.slice, 1)
    if now_range[0] < before[1]:
        raise RunRefused(
            f"data.slice={now.slice} (times [{now_range[0]}, {now_range[1]})) overlaps or precedes the slice "
            f"trainer.init_from={str(path)!r} was trained through (data.slice={was.slice} of data.slices={was.slices}: "
            f"[{before[0]}, {before[1]})): an incremental run trains on the slice after its source's"
        )
    if now_range[0] > before[1]:
        log.warning(
            "data.slice=%d starts at %d, after a gap from the end of trainer.init_from's slice (%d): the rows between "
            "are never trained on",
            now.slice,
            now_range[0],
            before[1],
        )


def _range_times(t_min: int, t_max: int):
    import numpy as np  # noqa: PLC0415

    return np.array([t_min, t_max], dtype=np.int64)


def saved_world_size(state: TrainerState) -> int:
    return max(1, int(state.world_size))
