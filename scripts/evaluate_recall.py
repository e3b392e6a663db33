"""Offline recall evaluation of a trained run (a thin wrapper over ``python -m recsys.evaluate``).

    $ python scripts/evaluate_recall.py run_dir=runs/default
    $ torchrun --standalone --nproc_per_node=2 scripts/evaluate_recall.py run_dir=runs/default
"""

from recsys.evaluate import main

if __name__ == "__main__":
    main()
