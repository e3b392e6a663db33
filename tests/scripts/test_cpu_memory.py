"""The entry points' CPU allocator settings (recsys/utils/cpu_memory.py), each in a fresh interpreter: they are
process-wide, and torch reads its variable once, at its first allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, os, resource, sys
from recsys.utils.cpu_memory import tune_cpu_allocator
applied = tune_cpu_allocator()
import torch
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB: 16,384 pages of 4 KB
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"applied": applied, "thp": os.environ.get("THP_MEM_ALLOC_ENABLE"), "faults": faults}))
"""


def run_probe(code: str, **env: str) -> dict:
    user_set = ("THP_MEM_ALLOC_ENABLE", "GLIBC_TUNABLES", "MALLOC_")  # what tune_cpu_allocator leaves alone
    environ = {k: v for k, v in os.environ.items() if not k.startswith(user_set)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def thp_available() -> bool:
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return mode.exists() and "[never]" not in mode.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and transparent huge pages: Linux")
def test_big_tensors_get_huge_pages_and_malloc_keeps_freed_memory():
    got = run_probe(PROBE)
    assert got["thp"] == "1"
    assert got["applied"] == ["THP_MEM_ALLOC_ENABLE=1", "mallopt: mmap threshold 32 MB, trim threshold 1 GB"]
    if thp_available():  # one fault per 2 MB page instead of one per 4 KB page (16,384 for the block)
        assert got["faults"] < 4096, got


def test_what_the_user_set_wins():
    got = run_probe(PROBE, THP_MEM_ALLOC_ENABLE="0", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")
    assert (got["applied"], got["thp"]) == ([], "0")


def test_importing_an_entry_point_changes_nothing():
    """Only running ``python -m recsys.train`` (or evaluate / export) sets the allocator; importing it
    (as the tests and library users do) leaves the process as it was."""
    code = "import os, json, recsys.evaluate, recsys.export, recsys.train; print(json.dumps({'thp': os.environ.get('THP_MEM_ALLOC_ENABLE')}))"
    assert run_probe(code) == {"thp": None}


def test_bench_script_times_both_allocators():
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_cpu_memory.py"
    args = [
        "--num-users",
        "600",
        "--num-items",
        "500",
        "--chunk-size",
        "256",
        "--blocks",
        "1",
        "--threads",
        "1",
        "--rank",
        "32",
    ]
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["default"]["applied"] == [] and "THP_MEM_ALLOC_ENABLE=1" in result["tuned"]["applied"]
    for run in result.values():
        assert set(run["seconds_per_block"]) == {"score_block_topk", "graph_filter_block"}
        assert all(seconds > 0 for seconds in run["seconds_per_block"].values())
    assert "graph_filter_block:" in out.stdout and "x)" in out.stdout  # the ratio line
