"""A training run's directory (``runs/<run_name>/``): what a run writes there, reads back and guards.

    dir.py          what an earlier run left: set aside (trainer.resume=none), tidied, or reported as finished
    lock.py         one training at a time per run dir (``.lock``)
    links.py        no file a run writes in place (``.lock``, metrics.jsonl, train.log) is a symbolic link
    check.py        Hydra callbacks refusing a run dir before Hydra writes into it
    outputs.py      metrics.jsonl + TensorBoard, the results table
    results.py      results.json's training part
    checkpoint.py   reshardable DCP checkpoints (``checkpoints/step_*``, ``best/``) and TrainerState
    manager.py      the checkpoint policy: resume / init_from, saves and retention, the best weights
    preemption.py   SIGTERM / Ctrl-C: finish the step, checkpoint, exit 75 / 130
    config.py       the config a run's weights were trained with (what evaluate / export rebuild)

Atomic writes (``recsys/utils/atomic.py``) stay outside: the serving bundle and the reports use them too.
"""
