"""One training at a time per run dir: an exclusive lock on ``<run_dir>/.lock``.

Two trainings in one run dir (same ``run_name``) would interleave their checkpoints and report each
other's weights. The first takes the lock; a second fails at once, naming the dir and the owner.

The lock is an ``flock`` on the file, held while the run lives: the kernel drops it when the owner
exits however it dies (SIGKILL, OOM), so a lock left by a dead run is stale by construction and is
taken over (with a warning naming the old owner). The file's content (host, pid, start time) is
only for the messages. On several hosts the run dir must be on a shared file system whose locks
reach every host (NFSv4, Lustre, GPFS do).

``recsys.evaluate`` and ``recsys.export`` read a run dir under a shared lock on the same file (:func:`reading_run_dir`):
refused while a training holds it (its weights, results and served ranker still change), and a training started
while they read is refused in turn.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from recsys.rundir.links import refuse_link
from recsys.utils.refusals import ANOTHER_RUN_DIR, RunRefused

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunDirLockedError(RunRefused, RuntimeError):
    """Another training holds the run dir (a refusal: one line, recsys/utils/refusals.py)."""


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_link(self.path)  # written where it is: never through a link
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # NOFOLLOW: a link made meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirLockedError(_held_by_other(self.path)) from None
        previous = _read(self.path)
        if previous:  # its owner exited without releasing (killed): the kernel dropped its flock
            log.warning(
                "%s: taking over a stale lock of %s (that process is gone)", self.path.parent, _describe(self.path)
            )
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty lock file: released cleanly (a non-empty one was left by a dead run)
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def held_elsewhere(run_dir: Path) -> str | None:
    """The refusal a training in ``run_dir`` would meet at its lock (another training holds it), None if free;
    probed without keeping the lock or creating anything (the Hydra callback asks before ``.hydra/`` is rewritten)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # the training's own attempt names what is wrong
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _held_by_other(path)
    finally:
        os.close(fd)  # drops the probe's flock, if it got it
    return None


def _held_by_other(path: Path) -> str:
    """Why a training cannot take ``path``: a training holds it (the owner wrote itself in), or only readers do."""
    if _read(path):
        who = f"another training holds this run dir ({_describe(path)})"
    else:  # readers write nothing; a training that released it emptied the file
        who = f"recsys.evaluate or recsys.export is reading this run dir (lock file {path})"
    return f"{path.parent}: {who}; wait for it to finish, or train in {ANOTHER_RUN_DIR}"


@contextmanager
def reading_run_dir(*run_dirs: Path) -> Iterator[None]:
    """Hold a shared lock on each run dir's ``.lock`` (a refit dir's and the run dir it lies in, whose training writes
    both) while evaluate / export read them; a live training's exclusive lock refuses them, naming it.

    A dir without ``.lock`` (never trained here, or by an older version) is read as it is: nothing is created."""
    with ExitStack() as stack:
        for folder in run_dirs:
            path = Path(folder) / LOCK_FILE
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            stack.callback(os.close, fd)  # drops the shared flock
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirLockedError(
                    f"{path.parent}: a training is running in this run dir ({_describe(path)}); its weights, results "
                    "and served ranker are still changing: wait for it to finish, then run this again"
                ) from None
        yield


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(path: Path) -> str:
    owner = _read(path)
    if not owner:
        return f"lock file {path}"
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {owner.get('started')}; lock file {path}"


def lock_run_dir(run_dir: Path, env) -> RunLock | None:
    """Collective: rank 0 locks the run dir (the only rank that writes there); every rank raises if it could not."""
    lock, error = None, ""
    if env.is_main:
        try:
            lock = RunLock(run_dir).acquire()
        except RunDirLockedError as e:
            error = str(e)
    if env.world_size > 1:
        import torch.distributed as dist

        holder = [error]
        dist.broadcast_object_list(holder, src=0)
        error = holder[0]
    if error:
        raise RunDirLockedError(error)
    return lock
