"""The ``eval`` section of the training config: validation, and the rankers of the evaluation stage (which
of them the run's headline and bundle are: recsys.config.run resolves them); ``check_eval`` refuses values no run can use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recsys.config.need import Need


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [10, 20, 50])  # cut-offs reported
    valid_metric: str = "recall@20"  # early-stopping metric, computed on the valid split each epoch
    batch_size: int = 1024  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul in exact top-k
    # rankers of the evaluation stage after training: names registered in recsys/rankers/registry.py, and fusions
    # "a+b" of them; null: the registry's default list for the data, resolved and logged at the start of the run
    rankers: list[str] | None = None
    # modules imported before the rankers are resolved, each registering its rankers (recsys/rankers/plugins.py):
    # plug-in rankers for eval.rankers; recsys.evaluate imports the run's too
    plugins: list[str] = field(default_factory=list)
    # the ranker results.json's headline and recsys.export's bundle are (servable, among the rankers); "": the
    # servable one of ``rankers`` best on valid by valid_metric (ties: the later listed; without valid: the last)
    serve: str = ""
    # each ranker's settings by its name (conf/eval/rankers/<name>.yaml; every fusion a+b reads "fusion"), typed and checked
    # by the ranker's package (recsys/rankers/registry.py): eval.settings.<name>.<key>=value
    settings: dict[str, Any] = field(default_factory=dict)
    # a part of the default list (rankers: null) estimated to take longer than this on this host, its fits and rankings
    # together (recsys/rankers/cost.py), runs with the graph filter at a lower rank or is left out, logged with why; a
    # part eval.rankers lists is kept, with a warning (docs/evaluation.md, "What the stage costs"); 0: no bound
    default_max_minutes: float = 15.0
    # the same for memory: a part of the default list estimated to hold more than this share of the memory available
    # at the start of the run; 0: no bound
    default_max_memory_share: float = 0.5


# metric names eval.valid_metric may use, with "@K" for a K in eval.ks (recsys/ranking/metrics.py)
VALID_METRICS = ("recall", "recall_liang", "ndcg", "hit_rate", "mrr", "coverage")


def check_eval(e: EvalConfig, need: Need) -> None:
    """eval.*'s shared settings: the cut-offs, the early-stopping metric, the block sizes (the rankers and their
    settings are checked by recsys.job.ranker_choice.check_rankers)."""
    need(len(e.ks) > 0 and all(k >= 1 for k in e.ks), "eval.ks", e.ks, "cut-offs must be >= 1")
    metric, _, k = e.valid_metric.partition("@")
    valid_names = [f"{name}@{k}" for name in VALID_METRICS for k in e.ks]
    need(
        metric in VALID_METRICS and k.isdigit() and int(k) in e.ks,
        "eval.valid_metric",
        e.valid_metric,
        f"choose one of {', '.join(valid_names)}",
    )
    need(e.default_max_minutes >= 0, "eval.default_max_minutes", e.default_max_minutes, "must be >= 0 (0: no bound)")
    need(
        0 <= e.default_max_memory_share <= 1,
        "eval.default_max_memory_share",
        e.default_max_memory_share,
        "must be in [0, 1] (0: no bound)",
    )
    need(
        e.batch_size >= 1 and e.chunk_size >= 1,
        "eval.batch_size / eval.chunk_size",
        (e.batch_size, e.chunk_size),
        "must be >= 1",
    )
