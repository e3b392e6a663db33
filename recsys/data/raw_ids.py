"""Raw 64-bit ids for model.id_mapping=managed: where they come from, how they are checked, how they are hashed.

A managed table (recsys/model/managed.py) is looked up by the id the log gave, not by the dataset dir's index::

    dataset index u  --raw_user_ids[u]-->  raw id (int64; a uint64 id is its two's-complement int64)
                     --hash_keys-->        key in [0, 2^63 - 1)  (what torchrec's MCH module stores and buckets)
                     --MCH remap-->        row in [0, zch_size)

Raw ids come from the dataset dir's vocabularies (``vocab/users.parquet`` / ``vocab/items.parquet`` raw_id), or
are the indices themselves where it has none (the synthetic generator's ids are its indices). Integer text ids
are read as integers (``"18446744073709551615"`` is the uint64 maximum); an id that needs more than 64 bits, or
is not an integer, is refused naming the file, row and value.

``hash_keys`` (torch, inside the model: torchrec's ``input_hash_func``) and ``hash_keys_numpy`` (the serving
bundle) are the same function: splitmix64's finaliser, reduced mod 2^63 - 1. It spreads any id set evenly over
the row-wise buckets (ranks own key ranges), and is a bijection on 64 bits before the reduction, so two raw ids
share a key with probability ~2^-63 per pair (about 5e-6 expected collisions among 10^7 ids).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from data_pipelines.errors import DatasetError

KEY_SPACE = (
    2**63 - 1
)  # keys are in [0, KEY_SPACE): torchrec's default input_hash_size; KEY_SPACE itself marks an empty slot
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's finaliser multipliers
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 it reads as."""
    return value - 2**64 if value >= 2**63 else value


def hash_keys_numpy(raw: np.ndarray) -> np.ndarray:
    """int64 raw ids -> int64 keys in [0, KEY_SPACE) (numpy twin of :func:`hash_keys`)."""
    z = np.asarray(raw, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(KEY_SPACE)).astype(np.int64)


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def hash_keys(raw: torch.Tensor, size: int = KEY_SPACE) -> torch.Tensor:
    """int64 raw ids -> int64 keys in [0, size) (torchrec MCH's ``input_hash_func(values, input_hash_size)``).

    int64 products wrap like uint64 ones; the reduction mod 2^63 - 1 of the unsigned value is done on its halves.
    """
    z = raw.to(torch.int64)
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    z = z ^ _shr(z, 31)
    if size != KEY_SPACE:
        raise ValueError(f"hash_keys: input_hash_size {size}, expected {KEY_SPACE}")
    # unsigned z = hi * 2^63 + lo with lo < 2^63; 2^63 = 1 (mod 2^63 - 1): z mod (2^63 - 1) = (hi + lo) mod (2^63 - 1)
    hi, lo = _shr(z, 63), z & KEY_SPACE
    total = lo + hi  # <= 2^63 - 1 + 1: the one overflowing case wraps negative
    total = torch.where(total < 0, total - KEY_SPACE, total)  # 2^63 -> 1 (as int64: wrap, then fold)
    return torch.where(total >= KEY_SPACE, total - KEY_SPACE, total)


def parse_raw_ids(values, label: str, field: str) -> np.ndarray:
    """A vocabulary's raw ids -> int64 (uint64 ids as their two's-complement int64), or an error naming the first bad one.

    ``values``: integers, or text holding integers ("007" is 7). Refused: an id beyond 64 bits (below -2^63 or
    above 2^64 - 1), and text that is not an integer.
    """
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)  # uint64 beyond 2^63 wraps to its int64 bit pattern
    out = np.empty(len(array), dtype=np.int64)
    for row, value in enumerate(array.tolist()):
        text = str(value).strip()
        if not _INTEGER.match(text):
            raise DatasetError(
                f"{label}: row {row + 1}: {field} = {text!r} is not an integer; model.id_mapping=managed reads raw ids "
                "as 64-bit integers (use model.id_mapping=vocab for text ids)"
            )
        number = int(text)
        if not -(2**63) <= number < 2**64:
            raise DatasetError(
                f"{label}: row {row + 1}: {field} = {text} is beyond 64 bits; model.id_mapping=managed takes raw ids in "
                "[-2^63, 2^64) (use model.id_mapping=vocab, whose ids are the dataset's indices)"
            )
        out[row] = _signed(number) if number >= 0 else number
    return out


def read_raw_ids(vocab_file: Path, id_column: str, num_ids: int) -> np.ndarray:
    """``raw_id`` of every index 0..num_ids-1 of a vocabulary file, as int64; the indices themselves without a file."""
    if not vocab_file.is_file():
        return np.arange(num_ids, dtype=np.int64)
    import pandas as pd  # noqa: PLC0415 (the serving bundle imports this module for hash_keys_numpy alone)

    frame = pd.read_parquet(vocab_file, columns=[id_column, "raw_id"])
    index = frame[id_column].to_numpy()
    if len(index) != num_ids or not np.array_equal(np.sort(index), np.arange(num_ids)):
        raise DatasetError(f"{vocab_file}: column {id_column!r} must list every index 0..{num_ids - 1} once")
    raw = np.empty(num_ids, dtype=np.int64)
    raw[index] = parse_raw_ids(frame["raw_id"].to_numpy(), str(vocab_file), "raw_id")
    return raw


def with_raw_ids(data):
    """``data`` (a RetrievalData) with the raw id of every user and item index: what its batches give the managed
    tables. From vocab/users.parquet and vocab/items.parquet, or the indices where the dataset dir has none."""
    from data_pipelines.dataset_dir import ITEMS_VOCAB, USERS_VOCAB  # noqa: PLC0415 (as above)

    return replace(
        data,
        raw_user_ids=read_raw_ids(data.dir / USERS_VOCAB, "user_id", data.num_users),
        raw_item_ids=read_raw_ids(data.dir / ITEMS_VOCAB, "item_id", data.num_items),
    )
