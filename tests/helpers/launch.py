"""Run a command line in a fresh process (or a torchrun job) as a user's shell would start it.

The test process has joined a one-process group (tests/conftest.py), which filled in torchrun's
variables; a child that inherited them would think it is rank 0 of that group. :func:`launch`
strips them, pins one BLAS thread per process (2 ranks on a 2-core CI box) and puts the repo on
``PYTHONPATH`` (for the scripts under tests/helpers/).

    proc = launch(["-m", "recsys.evaluate", f"run_dir={run_dir}"])              # python -m ...
    proc = launch(["-m", "recsys.train", ...], nproc=2, max_restarts=1)          # torchrun ...
    proc = launch([...], nproc=2, check=False); assert proc.returncode != 0      # a failure expected
    procs = launch_agents(["-m", "recsys.train", ...], max_restarts=1)          # 2 "hosts": 2 torchrun agents
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_agents(
    args: Sequence[str],
    *,
    nnodes: int = 2,
    max_restarts: int = 0,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
) -> list[subprocess.CompletedProcess]:
    """``nnodes`` torchrun agents on this machine, as on ``nnodes`` hosts: docs/training-at-scale.md's multi-host command
    (c10d rendezvous on a free localhost port, one worker per agent), each agent started alone.

    Asserts every agent exits 0 within ``timeout`` (showing each one's output tail otherwise); on any
    failure every agent is stopped with its workers, so no worker outlives the test.
    """
    endpoint = f"localhost:{free_port()}"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        "--nproc_per_node=1",
        f"--max-restarts={max_restarts}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={endpoint}",
        f"--rdzv_id=test-{os.getpid()}",
        *args,
    ]
    logs = [tempfile.TemporaryFile("w+") for _ in range(nnodes)]  # files, not pipes: a full pipe would block an agent
    agents = [
        subprocess.Popen(command, env=clean_env(env), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        for log in logs
    ]
    deadline, timed_out = time.monotonic() + timeout, False
    try:
        while None in (codes := [a.poll() for a in agents]):
            if any(code not in (None, 0) for code in codes):
                time.sleep(5)  # the others' last lines may say why; then stop them
                break
            if timed_out := time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        _stop(agents)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    done = [subprocess.CompletedProcess(command, a.returncode, out, "") for a, out in zip(agents, outputs)]
    report = "\n".join(f"--- agent {i}: exit {d.returncode}\n{d.stdout[-5000:]}" for i, d in enumerate(done))
    why = f"still running after {timeout:.0f} s, stopped" if timed_out else "failed"
    assert all(d.returncode == 0 for d in done), f"torchrun agents {why}\n{report}"
    return done


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # gone already (or no /proc: nothing more to find)
        return []


def _stop(agents: Sequence[subprocess.Popen]) -> None:
    """SIGTERM the agents still running (each stops its workers, up to 30 s), then SIGKILL whatever is left.

    torchrun starts every worker in a session of its own: killing an agent's process group would miss them.
    """
    running = [a for a in agents if a.poll() is None]
    for agent in running:
        agent.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for agent in running:
        try:
            agent.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            for pid in [*_children(agent.pid), agent.pid]:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(pid, signal.SIGKILL)
            agent.wait()
