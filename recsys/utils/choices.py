"""Values that both the config schema (recsys/config/) and the code that acts on them name: kept here, at the
bottom of the import graph, so that the config never imports the evaluation code (and serving never the config)."""

ANN_KINDS = ("flat", "ivf_flat", "hnsw")  # FAISS index kinds (recsys/evaluation/ann.py)
EASE_LAMBDAS = (10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)  # EASE's λ grid: 10..1e4 in half-decade steps
