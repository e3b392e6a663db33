"""Entry points run in this process as ``python -m`` runs them (``runpy``, Hydra and all), and what tests read of
their outcome: a refusal is one ``error:`` line on stderr and exit status 1, its traceback in train.log only."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]  # no train.log, no Hydra log lines


def run_module(monkeypatch, module: str, args: list[str]) -> int:
    """``python -m module *args`` in this process; its exit status (0 when it returns)."""
    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def one_error_line(err: str) -> str:
    """The one ``error:`` line of stderr; no traceback there."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def files(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` (relative path -> bytes): to assert that nothing was written or changed."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
