"""Loaders for a run's files that never execute code from the file.

A run dir, a checkpoint or a serving bundle may come from someone else (a shared file system, a
downloaded bundle), so nothing read from one may run code when it is loaded:

- ``torch.load`` only with ``weights_only=True`` (tensors, containers, numbers, strings);
- DCP's ``.metadata`` (a pickle that ``torch.distributed.checkpoint`` reads with plain
  ``pickle.load``) through :class:`SafeFileSystemReader`, whose unpickler only builds the
  metadata classes DCP writes; a checkpoint's shards through :func:`load_dcp`, whose planner unpickles
  the values the metadata calls bytes weights-only too (DCP's own: ``weights_only=False``);
- ``np.load`` with ``allow_pickle=False``; a run's YAML through ``load_config_yaml``
  (recsys/rundir/saved_config.py: OmegaConf's safe loader, a Python tag refused, never built); JSON; parquet.

A refused file raises :class:`UnsafeFileError` naming it, before anything from it is built; a file that cannot
be read at all (truncated, not of its kind) raises :class:`UnreadableFile` naming it. Both are refusals: an entry
point prints them as one line (recsys/utils/refusals.py).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.futures import Future

from recsys.utils.refusals import RunRefused


class UnsafeFileError(RunRefused, pickle.UnpicklingError):
    """A file asked to build an object (or call a function) that a plain data file never holds."""


class UnreadableFile(RunRefused):
    """A file that cannot be read as what it should be (written in part, damaged, or another kind of file)."""


# the parts of torch's weights-only refusal that advise, rather than say what the file asked for (one of them: load it
# again with weights_only=False, which is what a crafted file wants)
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _refused_global(e: pickle.UnpicklingError) -> str:
    """What the unpickler refused, e.g. "Trying to load unsupported GLOBAL posix.system ...", on one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join([line for line in lines if not line.startswith(_TORCH_ADVICE)] or lines[:1])


def _unreadable(path: Path, e: BaseException) -> UnreadableFile:
    reason = (str(e).splitlines() or [type(e).__name__])[0]
    return UnreadableFile(
        f"{path}: cannot be read ({type(e).__name__}: {reason}); written in part or damaged? "
        "Write it again (train, export) or restore it"
    )


# (module, name) pairs a DCP .metadata pickle written by torch / torchrec may reference: dataclasses,
# enums and value types that only store their arguments, never callables that act on them
_DCP_METADATA_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch's layouts by name
    *(("pathlib", name) for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")),  # checkpoint_id
    *(("torch", name) for name in ("strided", "sparse_coo", "sparse_csr", "_mkldnn")),  # layouts
    *(("torch", name) for name in ("contiguous_format", "preserve_format", "channels_last", "channels_last_3d")),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "ChunkStorageMetadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "LoadItemType"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
}
_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_METADATA_GLOBALS or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise UnsafeFileError(
            f"{self.path}: refused to load: it asks for {module}.{name}, which a checkpoint's "
            "metadata never holds (a crafted file?); nothing from it was run"
        )


def load_dcp_metadata(path: Path):
    """A DCP ``.metadata`` file, unpickled with the allow-list above."""
    with open(path, "rb") as f:
        return _MetadataUnpickler(io.BytesIO(f.read()), path).load()


class SafeFileSystemReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` whose metadata is read without running code (tensor data is already
    read by DCP with ``torch.load(weights_only=True)``)."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        metadata = load_dcp_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:  # as dcp.FileSystemReader does
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan, planner):
        """DCP's reads, one shard file at a time, so that a refused or unreadable shard is named."""
        by_file: dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative_path, items in by_file.items():
            shard = Path(self.path) / relative_path
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner)
            except pickle.UnpicklingError as e:
                raise UnsafeFileError(
                    f"{shard}: refused to load: not a checkpoint shard recsys wrote, it holds more than tensors and "
                    f"plain values (a crafted file?); nothing from it was run ({_refused_global(e)})"
                ) from None
            except (RuntimeError, EOFError) as e:  # torch's zip reader, a short read
                raise _unreadable(shard, e) from None
        done: Future[None] = Future()
        done.set_result(None)
        return done


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but a value the metadata calls bytes (not a tensor) is unpickled weights-only: DCP's own
    unpickles it with ``weights_only=False``, so a crafted ``.metadata`` that called a tensor bytes ran any pickle."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        plain = io.BytesIO()
        torch.save(torch.load(value, weights_only=True), plain)  # saved again: a pickle of tensors and plain values
        plain.seek(0)
        super().load_bytes(read_item, plain)


def load_dcp(state_dict: dict[str, Any], path: Path) -> None:
    """Collective: ``dcp.load`` of the checkpoint ``path`` into ``state_dict`` through the reader and planner above.
    A refused or unreadable file of any rank is raised on every rank as that refusal, one line naming the file (DCP
    gathers each rank's error, with its traceback, into one CheckpointException)."""
    try:
        dcp.load(
            state_dict,
            checkpoint_id=str(path),
            storage_reader=SafeFileSystemReader(str(path)),
            planner=SafeLoadPlanner(),
        )
    except CheckpointException as e:
        refusal = next((error for error, _ in e.failures.values() if isinstance(error, RunRefused)), None)
        if refusal is None:
            raise
        raise refusal from None


def torch_load_weights(path: Path, **kwargs: Any) -> Any:
    """``torch.load(weights_only=True)``, with a refusal that names the file."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        raise UnsafeFileError(
            f"{path}: refused to load: it holds more than tensors and plain values (a crafted "
            f"file?); nothing from it was run ({_refused_global(e)})"
        ) from None
    except FileNotFoundError:
        raise
    except (RuntimeError, OSError, EOFError, ValueError) as e:  # torch's zip reader, a short read
        raise _unreadable(path, e) from None


def numpy_load(path: Path, **kwargs: Any) -> np.ndarray:
    """``np.load`` of a plain array: object arrays (pickles) are refused naming the file."""
    try:
        return np.load(path, allow_pickle=False, **kwargs)
    except ValueError as e:
        if "allow_pickle" not in str(e):
            raise _unreadable(path, e) from None
        raise UnsafeFileError(
            f"{path}: refused to load: an object array (a pickle), not a numeric one; nothing from it was run"
        ) from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _unreadable(path, e) from None
