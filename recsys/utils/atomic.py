"""Atomic writes: a reader sees the old file (or folder) or the new one, never half of either.

Every output recsys writes goes through here (results.json, metrics.jsonl trims, the offline
report's files, the serving bundle). data_pipelines keeps its own copy for the dataset dir: it
never imports recsys.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it over ``path``.

    The temporary file is created by ``write`` itself, so it gets the usual permissions (umask).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON with sorted keys and a final newline."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def replace_dir(tmp: Path, out: Path) -> None:
    """Rename the complete folder ``tmp`` to ``out``; an existing ``out`` is renamed aside first, then deleted."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    if out.exists():
        out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        if old.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
