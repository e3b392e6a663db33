"""The evaluation stage's cost model against what a run measured, part by part, and the rates it is built on.

    $ python scripts/stage_costs.py runs/gowalla                 # results.json: the plan's estimates vs the stage's times
    $ python scripts/stage_costs.py runs/gowalla/eval/report.json  # the same for a recsys.evaluate report
    $ python scripts/stage_costs.py --calibrate                  # this host's rates, per thread (recsys/rankers/cost.py)

For each ranker of the stage: the plan's estimate (its fits on every split, its ranking of valid at its grid and of
test; recsys/rankers/stage_cost.py) beside the seconds the stage recorded (results.json's
``rankers.<name>.fit.<split>``: ``fits_seconds``, its own fit and its parts', and ``ranking_seconds``), and their
ratio. ``--calibrate`` times the kernels the formulas count (a float32 GEMM, a sparse product, EASE's factorisation,
the top-k selection, a fusion's elementwise passes, one ALS fit, the graph filter's [2112, 2112] eigh) and prints one
thread's rates, what
``recsys.rankers.cost.Throughput`` holds; the load beside them (the box is shared) goes with any figure quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from recsys.rankers.cost import Throughput


def _best(fn, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def load_note() -> str:
    """The load average and the share of CPU time the host took (steal) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    steal = fields[7] / max(sum(fields), 1)
    return f"load average {os.getloadavg()[0]:.2f} (1 min), steal {100 * steal:.1f}% since boot"


def calibrate(threads: int) -> Throughput:
    """One thread's rates on this host, timed at ``threads`` torch threads (the best of a few rounds)."""
    import scipy.sparse as sp

    from recsys.rankers.fusion import spread_normalised_rows
    from recsys.rankers.graph_filter.spectral import torch_csr
    from recsys.ranking.interactions import UserItemCSR
    from recsys.ranking.retrieval import topk_from_scores

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    rows, width, items = 2048, 1024, 20_000
    queries, vectors, out = torch.randn(rows, width), torch.randn(width, items), torch.empty(rows, items)
    dense = 2 * rows * width * items / _best(lambda: torch.mm(queries, vectors, out=out)) / 1e9
    users, nnz, block = 60_000, 1_000_000, 320
    pairs = sp.csr_matrix(
        (np.ones(nnz, np.float32), (rng.integers(0, users, nnz), rng.integers(0, 40_000, nnz))), shape=(users, 40_000)
    )
    pairs.sum_duplicates()
    norm, norm_t, x = torch_csr(pairs), torch_csr(pairs.T.tocsr()), torch.randn(40_000, block)
    sparse = 4 * pairs.nnz * block / _best(lambda: norm_t @ (norm @ x)) / 1e9
    factor = {}
    for dtype in (torch.float64, torch.float32):
        n = 3000
        g = torch.randn(n, n, dtype=dtype)
        g = g @ g.t() + n * torch.eye(n, dtype=dtype)

        def factorise(g=g) -> None:
            a = g.clone()
            a_cm = a.mT
            torch.linalg.cholesky_ex(a_cm, out=(a_cm, torch.empty((), dtype=torch.int32)))
            torch.cholesky_inverse(a_cm, out=a_cm)

        factor[dtype] = n**3 / _best(factorise, 2) / 1e9
    rows, items = 4096, 40_000
    scores = torch.randn(rows, items)
    seen = UserItemCSR.from_pairs(
        rng.integers(0, rows, rows * 30), rng.integers(0, items, rows * 30), num_users=rows, num_items=items
    )
    copy = _best(lambda: scores.clone())
    per_score = 1e9 / (rows * items)
    select = (_best(lambda: topk_from_scores(scores.clone(), 50, exclude=seen)) - copy) * per_score
    spread = (_best(lambda: spread_normalised_rows(scores.clone())) - copy) * per_score
    other = scores.clone()
    add = _best(lambda: torch.add(scores, other, alpha=0.1)) * per_score
    ials = _ials_ns()
    n = 2112  # the default rank's Rayleigh-Ritz matrix (2048 + 64)
    symmetric = torch.randn(n, n, dtype=torch.float64)
    symmetric = symmetric @ symmetric.t()
    eigh = _best(lambda: torch.linalg.eigh(symmetric), 1) / n**3 * 1e9
    return Throughput(
        dense_gflops=round(dense / threads, 1),
        sparse_gflops=round(sparse / threads, 2),
        factor64_gflops=round(factor[torch.float64] / threads, 2),
        factor32_gflops=round(factor[torch.float32] / threads, 2),
        select_ns=round(select * threads, 2),
        add_ns=round(add * threads, 1),
        spread_ns=round(spread * threads, 1),
        ials_ns=round(ials * threads, 2),
        eigh_ns=round(eigh, 2),
    )


def _ials_ns() -> float:
    """ns of one ALS fit per unit of ``iterations x (interactions x D + (users + items) x D^2)`` (this process's
    threads: implicit runs one per core above 100k interactions)."""
    from recsys.rankers.ials.solve import fit_ials
    from recsys.ranking.interactions import UserItemCSR

    rng = np.random.default_rng(0)
    users, items, nnz, factors, iterations = 20_000, 10_000, 400_000, 64, 5
    graph = UserItemCSR.from_pairs(
        rng.integers(0, users, nnz), rng.integers(0, items, nnz), num_users=users, num_items=items
    )
    seconds = _best(lambda: fit_ials(graph, regularization=1.0, alpha=10.0, factors=factors, iterations=iterations), 2)
    units = iterations * (graph.nnz * factors + (users + items) * factors**2)
    return seconds / units * 1e9


def _rows_and_plan(path: Path) -> tuple[dict, dict, str]:
    """(stage rows by ranker, the plan's description, what was read) from a run dir or a report.json."""
    if path.is_dir():
        path = path / "results.json"
    data = json.loads(path.read_text())
    if "evaluation_plan" not in data or not data["evaluation_plan"]:
        raise SystemExit(f"{path}: no evaluation_plan (written by a run of this code or later)")
    if "rankers" in data and "headline" in data:  # results.json
        rows = data["rankers"]
    elif "stage" in data:  # report.json
        rows = data["stage"]["rankers"]
    else:  # a report.json written before 2026-12-07: the stage's rows in its ease / ials / graph_filter blocks
        rows = {b["ranker"]: b for b in (data.get("ease", {}), data.get("ials", {})) if "ranker" in b}
        rows.update(data.get("graph_filter", {}).get("rankers", {}))
    return rows, data["evaluation_plan"], str(path)


def measured(row: dict) -> dict[str, float] | None:
    """{"fits", "valid", "test", "seconds"} a stage row recorded (None: skipped, or written before the split times)."""
    fit = row.get("fit", {})
    if not fit or any("ranking_seconds" not in v for v in fit.values()):
        return None
    out = {
        "fits": sum(v["fits_seconds"] for v in fit.values()),
        "valid": fit.get("valid", {}).get("ranking_seconds", 0.0),
        "test": fit.get("test", {}).get("ranking_seconds", 0.0),
    }
    return {**out, "seconds": out["fits"] + out["valid"] + out["test"]}


def compare(path: Path) -> list[str]:
    """The table's lines (markdown): per ranker, estimated against measured seconds."""
    rows, plan, source = _rows_and_plan(path)
    lines = [
        f"{source}: {plan.get('rankers')}; settings changed {plan.get('settings') or 'none'}",
        "| ranker | estimated fits / valid / test | estimated | measured fits / valid / test | measured | est / meas |",
        "|---|---|---|---|---|---|",
    ]
    for name, estimate in plan.get("estimate", {}).items():
        got = measured(rows.get(name, {}))
        est = (
            f"{estimate['fit_seconds']:.1f} / {estimate['valid_seconds']:.1f} / {estimate['test_seconds']:.1f}",
            f"{estimate['seconds']:.1f} s",
        )
        if got is None:
            lines.append(f"| {name} | {est[0]} | {est[1]} | not ranked | | |")
            continue
        ratio = estimate["seconds"] / got["seconds"] if got["seconds"] > 0 else float("nan")
        lines.append(
            f"| {name} | {est[0]} | {est[1]} | {got['fits']:.1f} / {got['valid']:.1f} / {got['test']:.1f} | "
            f"{got['seconds']:.1f} s | {ratio:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path, help="run dirs (results.json) or report.json files")
    parser.add_argument("--calibrate", action="store_true", help="time this host's rates (about a minute)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads to time with")
    args = parser.parse_args(argv)
    if not args.calibrate and not args.paths:
        parser.error("give run dirs / report.json files, or --calibrate")
    if args.calibrate:
        print(f"# {load_note()}; {args.threads} threads", flush=True)
        print(calibrate(args.threads))
    for path in args.paths:
        print("\n".join(compare(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
