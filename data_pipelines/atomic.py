"""Staged writes for data_pipelines: build beside the target, then one rename; readers never see half.

recsys/utils/atomic.py is recsys's copy of the same idea: the two packages share no code, data_pipelines
never imports recsys.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def staged(target: Path, tag: str, *, hidden: bool = False) -> Iterator[Path]:
    """Yields ``<target dir>/[.]<target name>.<tag>-<pid>-<random>`` to build a file or folder in; when the
    block ends without an exception it replaces ``target``; whatever happens, the staged path is gone after.

    A folder replaces an existing ``target`` folder by renaming the old one aside first (deleted after;
    put back if the swap fails), so ``target`` is always either the old complete one or the new one.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{'.' if hidden else ''}{target.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        yield tmp
        if tmp.is_dir():
            _swap_dir(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        _remove(tmp)


def _swap_dir(tmp: Path, target: Path) -> None:
    if not target.exists():
        tmp.rename(target)
        return
    old = target.with_name(f"{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    target.rename(old)
    try:
        tmp.rename(target)
    except BaseException:
        old.rename(target)
        raise
    shutil.rmtree(old, ignore_errors=True)
