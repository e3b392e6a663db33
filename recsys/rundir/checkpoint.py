"""Reshardable training checkpoints with torch.distributed.checkpoint (DCP).

Layout under ``<run_dir>/checkpoints/``::

    step_00001200/          one complete checkpoint (DCP: .metadata + one file per rank)
        trainer_state.json  step, epoch, next batch, early-stopping state, config fingerprint
        rng.pt              every rank's torch RNG state
        config.yaml         the run's resolved config (what recsys.evaluate / export rebuild the model from)
    step_00001200.tmp/      a checkpoint being written: never loaded, removed by the next save
    best/                   the weights of the best validation epoch (model only)

A checkpoint is written into ``<name>.tmp`` by every rank and renamed by rank 0 only after all
ranks finished, so a crash mid-write leaves the previous one intact. DCP stores each table shard
with its global offsets: a checkpoint saved by N processes loads on M processes and under another
sharding plan. On several hosts the run dir must be on a shared file system.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from recsys.distributed.env import DistEnv
from recsys.distributed.managed import refresh_managed
from recsys.distributed.sharding import ShardedModel
from recsys.utils.atomic import replace_dir
from recsys.utils.refusals import MissingPath, RunRefused
from recsys.utils.safe_load import SafeFileSystemReader, UnsafeFileError, load_dcp, torch_load_weights

STEP_DIR = re.compile(r"^step_(\d{8})$")
STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps taken
    samples: int = 0  # training examples consumed (summed over ranks)
    epoch: int = 0  # epoch the next batch belongs to
    next_batch: int = 0  # index of the next global batch within that epoch
    best_score: float = float("-inf")  # best valid metric so far
    best_epoch: int = -1
    bad_epochs: int = 0  # epochs since the best one
    train_seconds: float = 0.0
    early_stopped: bool = False  # early stopping ended training (more epochs would not resume it)
    fingerprint: str = ""  # data + model config the weights belong to
    world_size: int = 1  # of the run that saved it (informational: any world size may load it)
    global_batch_size: int = (
        0  # of the run that saved it: next_batch counts batches of this size (0: unknown, older checkpoints)
    )
    # model.id_mapping=managed: per table, the ids admitted and evicted by the run so far (summed over ranks), which a
    # resumed process counts on from (the module's own counters start at 0 in every process)
    managed_counts: dict[str, dict[str, int]] = field(default_factory=dict)


def _state_dicts(sharded: ShardedModel, with_optimizer: bool) -> dict[str, Any]:
    state: dict[str, Any] = {"model": sharded.module.state_dict()}
    if with_optimizer:
        state["optim"] = sharded.optimizer.state_dict()
    return state


CONFIG_FILE = "config.yaml"  # the run's resolved config, as the weights were trained with it


def read_trainer_state(path: Path) -> TrainerState:
    if not is_complete_checkpoint(path):
        raise MissingPath(f"{path}: not a complete checkpoint (no {STATE_FILE})")
    return TrainerState(**json.loads((path / STATE_FILE).read_text()))


def check_checkpoint_files(path: Path) -> None:
    """Every file DCP's metadata lists exists and is long enough, or an error naming the first that is not
    (a checkpoint copied in part, or truncated on disk, would otherwise fail deep inside DCP)."""
    try:
        metadata = SafeFileSystemReader(str(path)).read_metadata()
    except UnsafeFileError:
        raise
    except Exception as e:  # missing or unreadable .metadata
        raise MissingPath(f"{path}: incomplete checkpoint, its DCP .metadata cannot be read ({e})") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise MissingPath(f"{path}: incomplete checkpoint, {name} is missing")
        if file.stat().st_size < size:
            raise RunRefused(
                f"{path}: incomplete checkpoint, {name} has {file.stat().st_size} bytes, its metadata needs {size}"
            )


def has_optimizer_state(path: Path) -> bool:
    """Whether a checkpoint can be resumed (step checkpoints) or holds weights only (``best/``)."""
    try:
        keys = SafeFileSystemReader(str(path)).read_metadata().state_dict_metadata
    except UnsafeFileError:
        raise
    except Exception:  # unreadable metadata: load_checkpoint names what is wrong with it
        return True
    return any(key.startswith("optim.") for key in keys)


def is_complete_checkpoint(path: Path) -> bool:
    """Renamed into place by rank 0 after every rank finished writing (the state file comes last)."""
    return (path / STATE_FILE).is_file()


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete step checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and is_complete_checkpoint(p)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def _barrier(env: DistEnv) -> None:
    if env.world_size > 1:
        dist.barrier()


def save_checkpoint(
    sharded: ShardedModel,
    state: TrainerState,
    *,
    root: Path,
    env: DistEnv,
    name: str | None = None,
    keep_last: int = 2,
    with_optimizer: bool = True,
    config_yaml: str = "",
) -> Path:
    """Collective: every rank calls it. Returns the final path (``root/step_<step>`` or ``root/<name>``)."""
    final = root / (name or f"step_{state.step:08d}")
    tmp = final.with_name(final.name + ".tmp")
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier(env)
    try:
        dcp.save(_state_dicts(sharded, with_optimizer), checkpoint_id=str(tmp))
    except (OSError, CheckpointException) as e:  # a full disk says only "Errno 28": name where
        raise _write_error(tmp, e) from e
    rng: list[Any] = [None] * env.world_size
    if env.world_size > 1:
        dist.all_gather_object(rng, torch.get_rng_state())
    else:
        rng = [torch.get_rng_state()]
    if env.is_main:
        try:
            torch.save(rng, tmp / "rng.pt")
            if config_yaml:
                (tmp / CONFIG_FILE).write_text(config_yaml)
            (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        except OSError as e:
            raise _write_error(tmp, e) from e
        replace_dir(tmp, final)  # an existing one only for named checkpoints ("best")
        if name is None and keep_last > 0:
            for stale in complete_checkpoints(root)[:-keep_last]:
                shutil.rmtree(stale, ignore_errors=True)
    _barrier(env)
    return final


def read_rng_states(path: Path) -> list[torch.Tensor]:
    """Every rank's RNG state (uint8 tensors), loaded weights-only: a crafted rng.pt cannot run code."""
    rng = torch_load_weights(path / "rng.pt")
    if (
        not isinstance(rng, list)
        or not rng
        or not all(isinstance(r, torch.Tensor) and r.dtype == torch.uint8 for r in rng)
    ):
        raise ValueError(f"{path / 'rng.pt'}: expected a list of uint8 RNG state tensors")
    return rng


def _write_error(tmp: Path, e: BaseException) -> OSError:
    """The failure of a checkpoint write, naming the folder (DCP wraps each rank's error in a CheckpointException)."""
    causes = [c[0] if isinstance(c, tuple) else c for c in getattr(e, "failures", {}).values()] or [
        e
    ]  # DCP: (exception, traceback)
    errno = next((c.errno for c in causes if isinstance(c, OSError)), None)
    reason = "; ".join(f"{type(c).__name__}: {c}" for c in causes)
    earlier = complete_checkpoints(tmp.parent)
    if earlier:
        kept = f"the previous checkpoint ({earlier[-1].name}) is intact (free space on {tmp.parent}'s file system and run again to resume from it)"
    else:
        kept = f"no earlier checkpoint exists, so a rerun starts from step 0 (free space on {tmp.parent}'s file system first)"
    return OSError(errno, f"{tmp}: writing the checkpoint failed ({reason}); {kept}")


def load_checkpoint(sharded: ShardedModel, path: Path, *, env: DistEnv, with_optimizer: bool = True) -> TrainerState:
    """Collective: load weights (and optimizer state) in place, resharding as needed."""
    trainer_state = read_trainer_state(path)
    check_checkpoint_files(path)
    if with_optimizer and not sharded.dense_optimizer.state:
        saved_keys = SafeFileSystemReader(str(path)).read_metadata().state_dict_metadata
        if any(key.startswith(f"optim.state.{name}.") for name in sharded.dense_optimizer.params for key in saved_keys):
            sharded.dense_optimizer.init_state()  # KeyedOptimizer loads in place: its state must exist
    state = _state_dicts(sharded, with_optimizer)
    load_dcp(state, path)  # a crafted or damaged shard: one refusal naming it, on every rank
    sharded.module.load_state_dict(state["model"])
    refresh_managed(sharded.module)  # managed tables: their steps and free rows as loaded
    if with_optimizer:
        sharded.optimizer.load_state_dict(state["optim"])
    rng = read_rng_states(path)
    torch.set_rng_state(rng[env.rank] if len(rng) == env.world_size else rng[0])
    return trainer_state
