"""Offline recall evaluation of a trained run (a thin wrapper over ``python -m recsys.evaluate``).

$ python scripts/evaluate_recall.py run_dir=runs/default
$ torchrun --standalone --nproc_per_node=2 scripts/evaluate_recall.py run_dir=runs/default
"""

import runpy

if __name__ == "__main__":
    # run the module as __main__ so Hydra finds conf/ relative to recsys/evaluate.py
    runpy.run_module("recsys.evaluate", run_name="__main__", alter_sys=True)
