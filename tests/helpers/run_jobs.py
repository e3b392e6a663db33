"""Several trainings and evaluations in one torchrun job: each rank imports torch and torchrec and
joins the group once, then runs the jobs in order (a launch costs ~10 s of imports per process).

    $ torchrun --standalone --nproc_per_node=2 tests/helpers/run_jobs.py JOBS.json

JOBS.json is a list of ``{"fit": [overrides of +experiment=tiny], "run_dir": DIR}`` (what
``python -m recsys.train`` runs, minus Hydra's logging set-up) and ``{"evaluate": {EvaluateConfig
fields}}`` (what ``python -m recsys.evaluate`` runs). Each job is a collective over all ranks.
"""

import json
import sys

from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.job.run import fit
from tests.helpers.config import tiny_config


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    env = init_distributed("cpu", "gloo")  # every job below joins this group instead of making its own
    try:
        for job in jobs:
            if "fit" in job:
                fit(tiny_config(job["fit"]), job["run_dir"])
            else:
                evaluate_run(EvaluateConfig(**job["evaluate"]))
    finally:
        destroy_distributed(env)


if __name__ == "__main__":
    main()
