"""Export a trained run as a serving bundle (see recsys/serving/bundle.py for the layout).

    $ python -m recsys.export run_dir=runs/default                      # -> runs/default/export/
    $ torchrun --standalone --nproc_per_node=2 -m recsys.export run_dir=runs/default

The checkpoint is loaded on this job's ranks (any world size), every item is embedded by the
sharded model, and the query-side tables are gathered whole to rank 0: the query encoder serves
from one process, so the user, item and category tables must fit in that host's memory.
"""

from __future__ import annotations

from recsys.utils.cpu_memory import log_cpu_allocator, tune_cpu_allocator

# run as a program, not imported: set before anything imports torch, which reads THP_MEM_ALLOC_ENABLE
# at its first allocation
CPU_ALLOCATOR_SETTINGS = tune_cpu_allocator() if __name__ == "__main__" else []

import logging
import os

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from recsys.config import ExportConfig, register_configs, to_typed
from recsys.job.entry import refusals
from recsys.serving.export_run import export_run
from recsys.utils.logs import setup_logging

__all__ = ["ExportConfig", "export_run", "main"]


@record
@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    setup_logging(int(os.environ.get("RANK", "0")))  # console: recsys's lines; library chatter: the log file, rank 0
    log_cpu_allocator(logging.getLogger(__name__), CPU_ALLOCATOR_SETTINGS)
    with refusals():  # a refusal: one line on stderr, exit 1 (recsys/utils/refusals.py)
        print(export_run(to_typed(cfg, ExportConfig)))


if __name__ == "__main__":
    register_configs()
    main()
