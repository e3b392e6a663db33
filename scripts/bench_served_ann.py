"""The exported bundle's recommendations through each FAISS index kind against the exact search: recall of the
exact top-k, the test Recall@K / NDCG@K each serves, build time and query latency.

The bundle's own index (``index.faiss``, written by ``recsys.export index=...``) is one of these kinds; this
script builds each kind over the bundle's item vectors and searches them with the bundle's queries of every
test user (history = the user's train + valid items, masked), so that the figure a deployment gets from an
approximate index is stated beside the exact one. The last line printed is a JSON object.

    $ python scripts/bench_served_ann.py runs/gowalla               # the bundle in runs/gowalla/export
    $ python scripts/bench_served_ann.py runs/gowalla --kinds flat,hnsw --max-users 5000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a run dir with an exported bundle (python -m recsys.export run_dir=...)")
    p.add_argument("--bundle", type=Path, default=None, help="the bundle dir (default: <run_dir>/export)")
    p.add_argument("--kinds", default="flat,ivf_flat,hnsw", help="FAISS index kinds, comma-separated")
    p.add_argument("--k", type=int, default=20, help="cut-off")
    p.add_argument("--max-users", type=int, default=0, help="a seeded sample of test users (0: all)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    import numpy as np

    from data_pipelines.prepare import prepare_dataset
    from recsys.data.dataset import Interactions
    from recsys.evaluation.ann import compare_ann
    from recsys.job.assemble import open_dataset
    from recsys.ranking.interactions import UserItemCSR
    from recsys.ranking.metrics import compute_metrics
    from recsys.ranking.sharded import sample_users
    from recsys.rundir.config import load_run_config
    from recsys.serving.bundle import load_bundle

    args = parse_args(argv)
    bundle = load_bundle(args.bundle or args.run_dir / "export")
    cfg = load_run_config(args.run_dir)
    data = open_dataset(cfg, prepare_dataset(cfg.data))
    test = data.splits["test"]
    users = sample_users(np.unique(test.user_ids), args.max_users, seed=0)
    timeline = Interactions.concat(*(data.splits[s] for s in ("train", "valid") if s in data.splits))
    bounds = timeline.user_bounds(data.num_users)
    histories = [timeline.item_ids[bounds[u] : bounds[u + 1]] for u in users]
    lengths = np.array([len(h) for h in histories])
    # the users where the query reads them (the bundle refuses user ids its ranker would ignore)
    queries = bundle.encode(users if bundle.reads_users else None, lengths, np.concatenate(histories))
    exclude = UserItemCSR.from_pairs(np.repeat(np.arange(len(users)), lengths), np.concatenate(histories),
                                     num_users=len(users), num_items=data.num_items)  # fmt: skip
    relevant = UserItemCSR.from_pairs(test.user_ids, test.item_ids, num_users=data.num_users, num_items=data.num_items)
    relevant = relevant.select_rows(users)
    summary, ids = compare_ann(bundle.item_embeddings, queries, args.k, exclude=exclude, kinds=args.kinds.split(","))
    metrics = {kind: compute_metrics(i, relevant, [args.k], num_items=data.num_items) for kind, i in ids.items()}
    k = args.k
    print(
        f"{bundle.manifest['ranker']} bundle, {len(users):,} test users, {data.num_items:,} items, dim {bundle.manifest['dim']}"
    )
    rows = [("exact", 1.0, summary["exact"], None)] + [
        (kind, e["recall_vs_exact"], e, e["build_s"]) for kind, e in summary["indexes"].items()
    ]
    for kind, vs_exact, timing, build in rows:
        m = metrics[kind]
        print(
            f"{kind:>9}: recall vs exact@{k} {vs_exact:.4f}, test Recall@{k} {m[f'recall@{k}']:.4f}, NDCG@{k} "
            f"{m[f'ndcg@{k}']:.4f}, {timing['single_query_ms']:.2f} ms / query"
            + (f", built in {build:.1f} s" if build is not None else "")
        )
    out = {"ranker": bundle.manifest["ranker"], "users": len(users), "summary": summary, "metrics": metrics}
    print(json.dumps(out, default=float))
    return out


if __name__ == "__main__":
    main()
