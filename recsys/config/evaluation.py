"""The ``eval`` section of the training config: validation, and the rankers of the evaluation stage (which
of them the run's headline and bundle are: recsys.config.run resolves them); ``check_eval`` refuses values no run can use."""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys.config.need import Need


@dataclass
class GraphFilterConfig:
    """The ``graph_filter`` ranker (recsys/rankers/graph_filter.py): GF-CF's filter sharpened as BSPM, over the top
    ``rank`` eigenpairs of the user-item graph, so that it is a dot product the serving bundle ships."""

    # weights of the low-pass filter, chosen on valid when more than one; one by default, BSPM's 0.2: valid's
    # filter is fit without valid's rows (and the towers never see them), so valid under-weights the filter
    # and chose 0.1 where 0.2 ranks test better (docs/quality.md, "The low-pass weight")
    alphas: list[float] = field(default_factory=lambda: [0.2])
    # BSPM's sharpening times (one RK4 step of dU/dt = -U R~'R~; 0: GF-CF unsharpened), chosen on valid; BSPM's
    # 2.5 won over 0 on every Gowalla grid (docs/quality.md)
    sharpen: list[float] = field(default_factory=lambda: [2.5])
    rank: int = 2048  # eigenpairs of R~'R~ the linear filter keeps: the width of its query / item vectors
    low_rank: int = 256  # eigenvectors of the ideal low-pass filter (GF-CF's 256), among the rank kept
    iterations: int = 3  # subspace iterations of the randomized eigensolver (each one pass over the interactions)
    oversample: int = 64  # extra columns the eigensolver carries beyond rank (accuracy of the last eigenpairs)


@dataclass
class FusionConfig:
    """Every fusion ranker ``first+second`` (recsys/rankers/fusion.py): its parts' spread-normalised scores added."""

    # weights of the second part, chosen on valid (0: the first alone)
    betas: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.2])


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [10, 20, 50])  # cut-offs reported
    valid_metric: str = "recall@20"  # early-stopping metric, computed on the valid split each epoch
    batch_size: int = 1024  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul in exact top-k
    # rankers of the evaluation stage after training (recsys/rankers: two_tower, popularity, graph_filter, and
    # fusions "a+b"); null: two_tower and popularity, with two_tower+graph_filter where the query is a profile bag
    # over a co-occurrence graph (data.item_neighbors > 0), as resolved and logged at the start of the run
    rankers: list[str] | None = None
    # modules imported before the rankers are resolved, each registering its rankers (recsys/rankers/plugins.py):
    # plug-in rankers for eval.rankers; recsys.evaluate imports the run's too
    plugins: list[str] = field(default_factory=list)
    # the ranker results.json's headline and recsys.export's bundle are (servable, among the rankers); "": the
    # last servable one of ``rankers``
    serve: str = ""
    # the graph_filter ranker's settings, alone or as a part of a fusion
    graph_filter: GraphFilterConfig = field(default_factory=GraphFilterConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)  # every fusion ranker "a+b"


# metric names eval.valid_metric may use, with "@K" for a K in eval.ks (recsys/evaluation/metrics.py)
VALID_METRICS = ("recall", "recall_liang", "ndcg", "hit_rate", "mrr", "coverage")
FUSED_RANKER = "two_tower+graph_filter"  # the two-tower fused with the graph filter (recsys/rankers/fusion.py)
SERVABLE_RANKERS = ("two_tower", "graph_filter")  # dot products the bundle can ship (recsys/bundle_writer.py)


def check_eval(e: EvalConfig, rankers: list[str], serve: str, need: Need) -> None:
    """eval.*, with the rankers and the served one it resolves to (``resolved_rankers``, ``served_ranker``):
    their grids, the cut-offs and the early-stopping metric."""
    gfc = e.graph_filter
    need(len(rankers) > 0 and "two_tower" in rankers, "eval.rankers", rankers, "must list two_tower (what was trained)")
    need(
        serve in rankers and all(p in SERVABLE_RANKERS for p in serve.split("+")),
        "eval.serve",
        serve,
        f"must be one of eval.rankers ({', '.join(rankers)}) made of {' / '.join(SERVABLE_RANKERS)}",
    )
    for key, values in (
        ("graph_filter.alphas", gfc.alphas),
        ("fusion.betas", e.fusion.betas),
        ("graph_filter.sharpen", gfc.sharpen),
    ):
        need(
            len(values) > 0 and all(v >= 0 for v in values),
            f"eval.{key}",
            list(values),
            "must be a non-empty list of values >= 0",
        )
    for key in ("rank", "low_rank", "iterations"):
        need(getattr(gfc, key) >= 1, f"eval.graph_filter.{key}", getattr(gfc, key), "must be >= 1")
    need(gfc.oversample >= 0, "eval.graph_filter.oversample", gfc.oversample, "must be >= 0")
    need(len(e.ks) > 0 and all(k >= 1 for k in e.ks), "eval.ks", e.ks, "cut-offs must be >= 1")
    metric, _, k = e.valid_metric.partition("@")
    valid_names = [f"{name}@{k}" for name in VALID_METRICS for k in e.ks]
    need(
        metric in VALID_METRICS and k.isdigit() and int(k) in e.ks,
        "eval.valid_metric",
        e.valid_metric,
        f"choose one of {', '.join(valid_names)}",
    )
    need(
        e.batch_size >= 1 and e.chunk_size >= 1,
        "eval.batch_size / eval.chunk_size",
        (e.batch_size, e.chunk_size),
        "must be >= 1",
    )
