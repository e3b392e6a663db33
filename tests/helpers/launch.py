"""Run a command line in a fresh process (or a torchrun job) as a user's shell would start it.

The test process has joined a one-process group (tests/conftest.py), which filled in torchrun's
variables; a child that inherited them would think it is rank 0 of that group. :func:`launch`
strips them, pins one BLAS thread per process (2 ranks on a 2-core CI box) and puts the repo on
``PYTHONPATH`` (for the scripts under tests/helpers/).

    proc = launch(["-m", "recsys.evaluate", f"run_dir={run_dir}"])              # python -m ...
    proc = launch(["-m", "recsys.train", ...], nproc=2, max_restarts=1)          # torchrun ...
    proc = launch([...], nproc=2, check=False); assert proc.returncode != 0      # a failure expected
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(extra: Mapping[str, str] | None = None) -> dict:
    """This process's environment without torchrun's variables, one OpenMP thread, the repo importable."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(extra or {})
    return env


def launch(
    args: Sequence[str],
    *,
    nproc: int = 1,
    max_restarts: int | None = None,
    check: bool = True,
    timeout: float = 600,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python ARGS`` (nproc=1, no max_restarts) or ``torchrun --standalone --nproc_per_node=N ARGS``.

    check: assert exit status 0, showing the tail of both streams otherwise. env: extra variables.
    """
    if nproc == 1 and max_restarts is None:
        prefix = [sys.executable]
    else:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if max_restarts is not None:
            prefix.append(f"--max-restarts={max_restarts}")
    proc = subprocess.run(
        [*prefix, *args], env=clean_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc
