"""Byte sizes of a dataset dir's files, recorded in meta.json (``files``) when it is written and checked
by the cache check: a truncated or replaced file makes the dir "not prepared", so prepare rebuilds it
instead of keeping a damaged copy (whose readers would say "prepare the dataset again" forever)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


def file_sizes(root: Path, names: Iterable[str]) -> dict[str, int]:
    return {name: (root / name).stat().st_size for name in sorted(names)}


def damaged_files(root: Path, meta: dict) -> list[str]:
    """Files whose size differs from meta.json's record (or that are gone), each with what differs."""
    damaged = []
    for name, size in (meta.get("files") or {}).items():  # dirs written before sizes were recorded: nothing to check
        path = root / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            damaged.append(f"{path} ({'missing' if actual is None else f'{actual} bytes'}, meta.json records {size})")
    if damaged:
        log.warning("dataset dir %s is damaged, preparing it again: %s", root, "; ".join(damaged))
    return damaged
