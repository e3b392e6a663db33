"""The blocked in-batch softmax in bounded memory (scripts/bench_loss.py's figures, measured on CPU)."""

import pytest
import torch

from recsys.components.losses.in_batch_softmax import AUTO_BLOCK_MB, block_rows_for, resolve_block_mb
from tests.helpers.scripts import load_script

bench = load_script("bench_loss")


def test_blocked_loss_equals_dense_in_a_fraction_of_its_memory():
    """B = 2048 queries against 2048 + 256 candidates, blocks of 1 MiB (113 rows): the dense form holds 18 MiB of
    logits, the blocked one a block and the two gradients; loss and gradients equal to float rounding."""
    out = bench.main(["--batch", "2048", "--negatives", "256", "--block-mb", "1", "--rounds", "1"])
    assert out["block_rows"] == 2**20 // (4 * 2304)
    assert out["max_rel_grad_diff"] < 1e-5 and out["loss_rel_diff"] < 1e-6
    assert out["dense_peak_mb"] > 2048 * 2304 * 4 / 2**20  # at least its logits
    assert out["blocked_peak_mb"] < 0.25 * out["dense_peak_mb"]
    assert out["blocked_ms"] > 0 and out["dense_ms"] > 0


def test_blocked_loss_under_bf16_autocast_is_the_dense_loss():
    """trainer.precision=bf16: the blocks' GEMMs in bf16 as the dense form's; the candidates' gradient is summed over
    blocks in fp32 instead of one bf16 GEMM, so they agree to bf16's precision."""
    out = bench.main(["--batch", "512", "--block-mb", "0.25", "--rounds", "1", "--precision", "bf16"])
    assert out["block_rows"] == 128
    assert out["loss_rel_diff"] < 1e-5 and out["max_rel_grad_diff"] < 1e-2


def test_the_history_mask_keeps_the_blocked_form_equal_to_the_dense_one():
    """--history 10: every query's bag masked in both forms (the same loss and gradients), the unmasked blocked form
    timed beside them."""
    out = bench.main(["--batch", "512", "--num-items", "300", "--history", "10", "--block-mb", "0.25", "--rounds", "1"])
    assert out["history"] == 10 and out["block_rows"] == 128
    assert out["max_rel_grad_diff"] < 1e-5 and out["loss_rel_diff"] < 1e-6
    assert out["unmasked_ms"] > 0 and out["mask_time_ratio"] > 0


def test_block_budget_by_device_and_rows():
    assert resolve_block_mb(-1, torch.device("cpu")) == AUTO_BLOCK_MB["cpu"]
    assert resolve_block_mb(-1, torch.device("meta")) == AUTO_BLOCK_MB["cuda"]  # any accelerator
    assert resolve_block_mb(0, torch.device("cpu")) == 0
    assert block_rows_for(131072, 131072, 1024) == 2048  # 1 GiB of fp32 logits at C = 131072
    assert block_rows_for(1024, 1024, 64) == 1024  # the whole fits: the dense form
    assert block_rows_for(1024, 1024, 0) == 1024
    assert block_rows_for(10, 10**9, 1) == 1  # never zero rows


def test_bench_refuses_a_budget_that_blocks_nothing():
    with pytest.raises(SystemExit, match="nothing to block"):
        bench.main(["--batch", "256", "--block-mb", "64"])
