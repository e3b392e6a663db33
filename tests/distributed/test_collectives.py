"""all_gather_rows on 2 gloo processes: uneven blocks (one empty), gathered in several rounds."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.multiprocess


def _block(rank: int, rows: int) -> torch.Tensor:
    """Rank r's rows: distinct values so an out-of-place or missing row shows."""
    return torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + 1000 * (rank + 1)


def _worker(rank: int, port: int, cases, results) -> None:
    from recsys.distributed.collectives import all_gather_rows

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for i, (sizes, round_bytes) in enumerate(cases):
            got = all_gather_rows(_block(rank, sizes[rank]), 2, device=torch.device("cpu"), round_bytes=round_bytes)
            results[(rank, i)] = got
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_all_gather_rows_concatenates_uneven_blocks_in_rank_order_over_several_rounds():
    # 12 bytes a row: 24 bytes a round = 2 rows, so 7 rows take 4 rounds, the last one short
    cases = [((7, 5), 24), ((0, 5), 24), ((7, 0), 24), ((7, 5), 1 << 20), ((0, 0), 24)]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(_free_port(), cases, results), nprocs=2, join=True)
        results = dict(results)
    for i, (sizes, _) in enumerate(cases):
        expected = torch.cat([_block(0, sizes[0]), _block(1, sizes[1])])
        for rank in range(2):
            assert torch.equal(results[(rank, i)], expected), f"case {i} {sizes}, rank {rank}"
            assert results[(rank, i)].shape == (sum(sizes), 3)
