"""One clean line for every refusal: what an entry point prints when a run cannot go on for a
reason its user can fix from the message alone.

A refusal is a ``DatasetError`` (bad or missing input files), a ``ConfigError`` (a config key or
value that cannot work) or a ``RunRefused`` (the run's own state: a run dir another training
holds, weights of another data / model config, a checkpoint that cannot be resumed, a folder
export cannot write). ``python -m recsys.train`` / ``recsys.evaluate`` / ``recsys.export`` run
their work inside :func:`refusals`: a refusal is printed as ``error: <message>`` on stderr, on one
line, and the process exits 1; its traceback goes to the log file only (``train.log``). Anything
else is a bug and keeps its traceback.

In a sweep (``-m``) a job that fails, refused or not, stops the sweep: the summary of the jobs so
far is printed and the process exits 1 (docs/getting-started.md, "Sweeps"; Hydra alone would run the other jobs and
end without a summary).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from data_pipelines.errors import one_line
from recsys.utils.logs import FILE_ONLY
from recsys.utils.refusals import REFUSALS

log = logging.getLogger(__name__)


def _sweep_dir() -> Path | None:
    """The sweep's folder when this job is one of a ``-m`` sweep (None otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
    except ImportError:  # pragma: no cover - hydra is a dependency
        return None
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return Path(hydra_cfg.sweep.dir)


def _stop_sweep(sweep_dir: Path) -> None:
    """The summary of the sweep so far (rank 0), and that the jobs after this one will not run."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    from recsys.job.sweep_summary import write_summary

    started = sweep_dir / "multirun.yaml"  # written by Hydra's sweeper when the sweep started
    path = write_summary(sweep_dir, started.stat().st_mtime if started.is_file() else None)
    print(path.read_text(), file=sys.stderr, flush=True)
    print(
        f"error: the sweep stopped at this job; the jobs after it did not run (summary: {path})",
        file=sys.stderr,
        flush=True,
    )


@contextmanager
def refusals() -> Iterator[None]:
    """Run an entry point's work: a refusal becomes one line on stderr and exit status 1 (module docstring)."""
    try:
        yield
    except REFUSALS as e:
        log.info("refused: %s", one_line(e), exc_info=True, extra=FILE_ONLY)  # the traceback: the log file only
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        sweep_dir = _sweep_dir()
        if sweep_dir is not None:
            _stop_sweep(sweep_dir)
        sys.exit(1)
    except Exception:
        sweep_dir = _sweep_dir()
        if sweep_dir is None:
            raise
        log.exception("the job failed")  # a bug: its traceback on the console too
        _stop_sweep(sweep_dir)
        sys.exit(1)
