"""Process group set-up: from torchrun's environment, or a one-process group.

$ python -m recsys.train                                   # one process, gloo on CPU
$ torchrun --standalone --nproc_per_node=4 -m recsys.train # 4 processes (GPUs if present)
$ TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=2 --max-restarts=3 --rdzv_backend=c10d \
    --rdzv_endpoint=$HEAD_HOST:29500 ... -m recsys.train  # on every host (docs/training-at-scale.md; _attempt_store says why)
"""

from __future__ import annotations

import gc
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a rank waits in a collective. Ranks do wait on rank 0 alone: preparing a dataset,
# building the evaluation report (EASE, FAISS). NCCL's default is 10 minutes, gloo's 30.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    owns_group: bool = True  # False when the caller had already initialised the default group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("sharding.device=cuda but no CUDA device is visible; use sharding.device=cpu or auto")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"sharding.device={device!r}: expected 'auto', 'cpu' or 'cuda'")
    return torch.device(device)


# What torchrun's agents need in their environment (every host) for restarts across several agents.
UNSHARED_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def _attempt_store(world_size: int):
    """Under torchrun, a store namespaced by restart attempt; None (env://) otherwise.

    torchrun's agent keeps one store across restarts (--max-restarts): without a namespace the
    restarted workers can read the dead workers' gloo addresses and hang connecting to them.
    The attempt number is each agent's own count, so with several agents (--nnodes) it differs
    between them after a restart (the agent whose worker died counts it, the others restart their
    healthy workers without counting): refused, naming the setting that gives every attempt a
    fresh store instead (pytorch/pytorch#135712, #108158).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # env://, rank 0 hosts a new store: no torchrun, or agents started with UNSHARED_STORE_VAR=1
    num_agents = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if num_agents > 1 and max_restarts > 0:
        raise RuntimeError(
            f"torchrun: {num_agents} agents (--nnodes) with --max-restarts={max_restarts} share one store "
            "across restarts, and each agent counts restarts on its own: after a worker dies the restarted "
            "workers would read the dead workers' addresses and fail (gloo connectFullMesh: Connection "
            f"refused) or hang. Start torchrun with {UNSHARED_STORE_VAR}=1 in its environment on every host "
            "(rank 0 then hosts a new store for every attempt), as docs/training-at-scale.md's multi-host command does."
        )
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=COLLECTIVE_TIMEOUT,
    )
    return dist.PrefixStore(f"recsys/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


_own_group_of_one = False  # this process filled in the launcher's variables itself (plain `python -m ...`)


def init_distributed(device: str = "auto", backend: str = "auto") -> DistEnv:
    """Join (or create) the default process group and pick this rank's device."""
    global _own_group_of_one
    if "WORLD_SIZE" not in os.environ or _own_group_of_one:  # plain `python -m ...`: a group of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if _own_group_of_one:  # the next job of a `-m` sweep, in this process: the port the previous
            os.environ["MASTER_PORT"] = str(_free_port())  # group used may be taken by now ("address already in use")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        _own_group_of_one = True
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    dev = resolve_device(device)
    if dev.type == "cuda":
        # one GPU per local rank; modulo: launchers that give each process only its own GPU
        # (CUDA_VISIBLE_DEVICES per task, SLURM --gpus-per-task=1) show it as device 0
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            store=_attempt_store(world_size),
            timeout=COLLECTIVE_TIMEOUT,
        )
    return DistEnv(rank, world_size, local_rank, local_world_size, dev, backend, owns_group)


def destroy_distributed(env: DistEnv | None = None) -> None:
    """Tear down the group; collect garbage first, or torchrec's threads abort the exit (rc 1).

    Called from ``finally``: while an exception is propagating, the other ranks may be blocked
    in a collective this rank will never join, so there is no barrier then; the process exits
    with the error and torchrun stops the job.
    """
    gc.collect()
    if env is not None and not env.owns_group:
        return
    if dist.is_initialized():
        if sys.exc_info()[0] is None:
            dist.barrier()
        dist.destroy_process_group()
