"""Console vs log file: recsys's lines on the console, library chatter in the log file (rank 0 only)."""

import io
import logging
import warnings

import pytest
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.types import ParameterSharding, ShardingPlan

from recsys.distributed.plan_summary import plan_summary, rank_ranges
from recsys.utils.logs import FILE_ONLY, setup_logging


@pytest.fixture
def hydra_like_logging(tmp_path):
    """Root logger as Hydra's job logging leaves it (console + file handler); restored afterwards."""
    root, torch_logger = logging.getLogger(), logging.getLogger("torch")
    saved = (root.handlers[:], root.level, torch_logger.handlers[:], torch_logger.propagate, warnings.filters[:])
    console_stream = io.StringIO()
    console, file = logging.StreamHandler(console_stream), logging.FileHandler(tmp_path / "train.log")
    root.handlers = [console, file]
    root.setLevel(logging.INFO)
    torch_logger.handlers = [logging.StreamHandler(io.StringIO())]  # what torch._logging installs
    torch_logger.propagate = False
    warnings.simplefilter("always")  # pytest's own filters (pyproject.toml) ignore UserWarning
    # an entry point run in-process by an earlier test left warnings captured, and pytest's per-test recorder has
    # replaced showwarning since: start uncaptured, so that setup_logging's capture is this test's
    logging.captureWarnings(False)
    yield console_stream, tmp_path / "train.log", file
    file.close()
    root.handlers, root.level = saved[0], saved[1]
    torch_logger.handlers, torch_logger.propagate = saved[2], saved[3]
    warnings.filters[:] = saved[4]
    logging.captureWarnings(False)


def _emit_a_run():
    logging.getLogger("recsys.training.trainer").info("epoch 0: valid recall@20 = 0.25")
    logging.getLogger("recsys.training.trainer").info("sharding plan:\nthe full table", extra=FILE_ONLY)
    logging.getLogger("recsys.training.trainer").warning("fault injection: rank 1 exits")
    logging.getLogger("torchrec.distributed.planner.stats").info("# Planner Statistics")
    logging.getLogger().info("[TBE=abc] [AMD FP16 TEST] cache_precision=fp32")  # fbgemm logs on the root logger
    logging.getLogger("faiss.loader").info("Could not load library with AVX512 support")
    logging.getLogger("torchrec.distributed.planner.storage_reservations").warning(
        "There is a known issue with dry run"
    )
    logging.getLogger("torch.fx._symbolic_trace").warning("is_fx_tracing will return true")
    logging.getLogger("torchrec.distributed").error("a library error still shows")
    warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning, stacklevel=1)
    warnings.warn("an unknown library warning", UserWarning, stacklevel=1)


def test_rank0_console_shows_recsys_lines_and_errors_only(hydra_like_logging):
    console, log_file, _ = hydra_like_logging
    setup_logging(0)
    _emit_a_run()
    shown = console.getvalue().splitlines()
    assert shown == ["epoch 0: valid recall@20 = 0.25", "fault injection: rank 1 exits", "a library error still shows"]
    logged = log_file.read_text()
    for line in (
        "the full table",
        "Planner Statistics",
        "AMD FP16 TEST",
        "AVX512",
        "known issue with dry run",
        "is_fx_tracing",
        "an unknown library warning",
    ):
        assert line in logged, line
    assert "ShardedTensor" not in logged  # a known harmless warning: ignored where it arises


def test_other_ranks_log_their_own_warnings_and_errors_only(hydra_like_logging):
    console, log_file, _ = hydra_like_logging
    setup_logging(1)
    _emit_a_run()
    assert console.getvalue().splitlines() == ["fault injection: rank 1 exits", "a library error still shows"]
    assert log_file.read_text().splitlines() == ["fault injection: rank 1 exits", "a library error still shows"]


def _table_wise(rank, rows, dim):
    spec = EnumerableShardingSpec([ShardMetadata([0, 0], [rows, dim], f"rank:{rank}/cpu")])
    return ParameterSharding(sharding_type="table_wise", compute_kernel="fused", ranks=[rank], sharding_spec=spec)


def test_plan_summary_names_tables_types_ranks_and_memory():
    column_wise = ParameterSharding(
        sharding_type="column_wise",
        compute_kernel="fused",
        ranks=[0, 1],
        sharding_spec=EnumerableShardingSpec(
            [ShardMetadata([0, 0], [1024, 64], "rank:0/cpu"), ShardMetadata([0, 64], [1024, 64], "rank:1/cpu")]
        ),
    )
    data_parallel = ParameterSharding(sharding_type="data_parallel", compute_kernel="dense", ranks=[0, 1, 2])
    plan = ShardingPlan(
        {"model.ebc": {"user": _table_wise(2, 2048, 128), "item": column_wise, "category": data_parallel}}
    )
    line = plan_summary(plan, {"category": (256, 32)}, world_size=3)
    assert line.startswith(
        "sharding plan: user table_wise on rank 2, item column_wise on ranks 0-1, "
        "category data_parallel on ranks 0-2 | "
    )
    # rank 2: user 2048 x 128 x 4 B = 1 MB + category 256 x 32 x 4 B = 0.03 MB; ranks 0, 1: half the item table + category
    assert line.endswith("rank 0 0.28 MB, rank 1 0.28 MB, rank 2 1.03 MB")
    assert "\n" not in line
    assert rank_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
