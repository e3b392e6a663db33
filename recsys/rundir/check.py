"""Hydra callbacks that refuse a run dir before Hydra creates or writes anything in it (Hydra calls
``on_run_start`` / ``on_multirun_start`` before it makes the job's output dir and its ``.hydra/``):

- ``RunDirMustExist`` (conf/evaluate.yaml, conf/export.yaml): ``recsys.evaluate`` / ``recsys.export``
  refuse a missing ``run_dir`` argument (Hydra would fail on its own run dir, ``${run_dir}/...``), and a
  ``run_dir`` that does not exist, before Hydra creates their output dir (``<run_dir>/eval``, ``<run_dir>``)
  in it: a typo must not leave an empty run behind; and a run dir a training holds (its ``.lock``: they would
  read weights and results that are still changing).
- ``RunNameStaysInRuns`` (conf/config.yaml): ``recsys.train``'s ``run_name`` names a folder of
  ``runs/`` of its own: absolute, with ``..``, or through a symbolic link (to another run, or out of
  ``runs/``) it is refused, so no checkpoint, lock or ``.hydra/`` lands outside ``runs/`` or in
  another run's folder; a run dir another training holds (its ``.lock``) is refused before Hydra
  opens its train.log (its ``.hydra/`` only the run that trains there writes: recsys/rundir/record.py).

Both refuse a job log (``train.log``, ``export.log``, ``eval/evaluate.log``) or ``.lock`` / ``metrics.jsonl`` that
is a symbolic link before Hydra appends to it (recsys/rundir/links.py).

Both print one line (``error: ...``) and exit 1: Hydra turns a callback's exception into a warning
and goes on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePath
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from recsys.rundir.links import APPENDED, link_problem
from recsys.rundir.lock import RunDirLockedError, held_elsewhere, reading_run_dir


def _refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def _refuse_links(config: DictConfig, names: tuple[str, ...] = ()) -> None:
    """The job's log (Hydra opens it next, to append) and ``names`` in its run dir: none a symbolic link."""
    run_dir = Path(str(config.hydra.run.dir))
    for path in (run_dir / f"{config.hydra.job.name}.log", *(run_dir / name for name in names)):
        problem = link_problem(path)
        if problem:
            _refuse(problem)


class RunDirMustExist(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.is_missing(config, "run_dir"):  # else Hydra fails on its own run dir, ${run_dir}/..., unreadably
            _refuse(
                f"run_dir: required: the run dir `python -m recsys.train` wrote, e.g. "
                f"python -m recsys.{config.hydra.job.name} run_dir=runs/<run_name>"
            )
        run_dir = config.get("run_dir")
        if isinstance(run_dir, str) and run_dir and run_dir != "???" and not Path(run_dir).is_dir():
            _refuse(
                f"run_dir={run_dir}: no such run dir (nothing was created there); give the folder "
                "`python -m recsys.train` wrote, e.g. runs/<run_name>"
            )
        if isinstance(run_dir, str) and run_dir and run_dir != "???":
            try:  # a probe: the entry point takes the lock again for its work (recsys.job.trained.reading_run)
                with reading_run_dir(Path(run_dir)):
                    pass
            except RunDirLockedError as e:
                _refuse(str(e))
            _refuse_links(config)


def run_name_problem(run_name: str, run_dir: str) -> str | None:
    """Why ``run_name`` cannot name the run dir ``run_dir`` (Hydra's ``hydra.run.dir``, ``runs/${run_name}``
    unless set by hand); None: it can. A ``run_dir`` set by hand is the user's: only run_name's form is checked."""
    name = PurePath(run_name)
    if (
        not run_name
        or name.is_absolute()
        or not name.parts  # "." or "./": runs/ itself, beside every other run
        or any(part in ("..", ".") for part in run_name.split("/"))  # as typed: PurePath drops "."
        or run_name != run_name.strip()
    ):
        return (
            f"run_name={run_name!r}: must be a plain name (or a/b) inside runs/, without '..', '.', a leading '/' "
            "or surrounding spaces: a run writes its checkpoints, lock and results only under runs/"
        )
    path = Path(run_dir)
    if path.parts[-len(name.parts) :] != name.parts:  # hydra.run.dir set by hand: not derived from run_name
        return None
    root = Path(*path.parts[: -len(name.parts)]) if len(path.parts) > len(name.parts) else Path(".")
    part = root
    for component in name.parts:
        part = part / component
        if part.is_symlink():
            return (
                f"run_name={run_name}: {part} is a symbolic link (to {os.readlink(part)}); a run writes in a folder "
                "of its own, never through a link into another run or out of runs/: choose another run_name, "
                "or remove the link"
            )
    return None


class RunNameStaysInRuns(Callback):
    def __init__(self, probe_lock: bool = True) -> None:
        self.probe_lock = probe_lock  # false: data_pipelines.prepare, which takes no lock and writes no run dir

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, str(config.hydra.run.dir))
        if self.probe_lock:  # a run that writes a run dir (data_pipelines.prepare writes none)
            _refuse_links(config, APPENDED)
        if self.probe_lock and int(os.environ.get("RANK", "0")) == 0:  # rank 0 locks; another may find its own lock
            held = held_elsewhere(Path(str(config.hydra.run.dir)))
            if held:  # refused before Hydra opens that run's train.log (the lock itself is taken in fit)
                _refuse(held)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, str(config.hydra.sweep.dir))

    @staticmethod
    def _check(config: DictConfig, run_dir: str) -> None:
        run_name = config.get("run_name")
        if isinstance(run_name, str):
            problem = run_name_problem(run_name, run_dir)
            if problem:
                _refuse(problem)
