"""Loaders for a run's files that never execute code from the file.

A run dir, a checkpoint or a serving bundle may come from someone else (a shared file system, a
downloaded bundle), so nothing read from one may run code when it is loaded:

- ``torch.load`` only with ``weights_only=True`` (tensors, containers, numbers, strings);
- DCP's ``.metadata`` (a pickle that ``torch.distributed.checkpoint`` reads with plain
  ``pickle.load``) through :class:`SafeFileSystemReader`, whose unpickler only builds the
  metadata classes DCP writes;
- ``np.load`` with ``allow_pickle=False``; YAML through OmegaConf (a safe loader); JSON; parquet.

A refused file raises :class:`UnsafeFileError` naming it, before anything from it is built; a file that cannot
be read at all (truncated, not of its kind) raises :class:`UnreadableFile` naming it. Both are refusals: an entry
point prints them as one line (recsys/refusals.py).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from recsys.refusals import RunRefused


class UnsafeFileError(RunRefused, pickle.UnpicklingError):
    """A file asked to build an object (or call a function) that a plain data file never holds."""


class UnreadableFile(RunRefused):
    """A file that cannot be read as what it should be (written in part, damaged, or another kind of file)."""


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


def torch_load_weights(path: Path, **kwargs: Any) -> Any:
    """``torch.load(weights_only=True)``, with a refusal that names the file."""
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        raise UnsafeFileError(
            f"{path}: refused to load: it holds more than tensors and plain values (a crafted "
            f"file?); nothing from it was run ({str(e).splitlines()[0]})"
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
