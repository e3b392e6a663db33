"""report.md from the report dict: the protocol, metric tables, breakdowns, the stage's rankers (each one's point and
valid grid), ANN, more like this."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from recsys.rankers.registry import ranker_label
from recsys.utils.markdown import markdown_table


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"
    if isinstance(x, dict):
        return ", ".join(f"{k}={v}" for k, v in x.items())
    return str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return markdown_table(header, rows, cell=_fmt)


def _label(model: str, report: dict) -> str:
    del report  # same labels in every report
    return ranker_label(model)


def format_markdown(report: dict) -> str:
    """report.md from the report dict (tables, protocol, gaps, ANN, more like this)."""
    out = _header(report) + _splits(report) + _stage(report) + _ann(report) + _closing(report)
    return "\n".join(out)


def _header(report: dict) -> list[str]:
    """Title, run, dataset, protocol and the gap sentences."""
    model = report["model"]
    ds = report["dataset"]
    out = [f"# Offline evaluation: {model}", ""]
    out += [f"- checkpoint: `{report['checkpoint'] or 'n/a'}`", f"- dataset dir: `{ds['dir'] or 'n/a'}`"]
    if ds.get("name"):
        out.append(f"- dataset: {ds['name']} (split protocol {ds.get('protocol')})")
    counts = ds.get("counts") or {}
    count_text = ", ".join(f"{s} {n:,}" for s, n in counts.items())
    out.append(
        f"- {ds['num_users']:,} users, {ds['num_items']:,} items, {ds['num_train_pairs']:,} distinct training pairs"
        + (f"; interactions: {count_text}" if count_text else "")
    )
    out += ["", "## Protocol", ""]
    out.append(
        f"Full ranking over all {report['protocol']['num_candidates']:,} items (no sampled candidates); "
        "items the user interacted with in the masked splits are never recommended; "
        f"{report['protocol']['ties']}; {report['protocol']['users']}."
    )
    out += [""] + [f"- {s}" for s in report["protocol"]["sentences"].values()]
    out += ["", f"Recall@K = {report['protocol']['recall']}. NDCG: {report['protocol']['ndcg']}.", ""]
    out += ["## Summary", ""] + [f"- {s}" for s in report["gaps"]] + [""]

    return out


def _splits(report: dict) -> list[str]:
    """Per split: metric tables and the activity / popularity breakdowns."""
    ks, hk, model = report["ks"], report["headline_k"], report["model"]
    out: list[str] = []
    for name, split in report["splits"].items():
        out += [f"## {name} ({split['num_users']:,} users, {split['num_relevant_pairs']:,} held-out pairs)", ""]
        models = list(split["metrics"])
        cols = [f"{m}@{k}" for m in ("recall", "ndcg") for k in ks]
        out += _table(
            ["model", *cols], [[_label(m, report), *(split["metrics"][m][c] for c in cols)] for m in models]
        ) + [""]
        cols = [f"{m}@{k}" for m in ("recall_liang", "hit_rate", "mrr", "coverage") for k in ks]
        out += _table(
            ["model", *cols], [[_label(m, report), *(split["metrics"][m][c] for c in cols)] for m in models]
        ) + [""]
        key = f"recall@{hk}"
        out += [f"### Recall@{hk} by user activity (distinct training items)", ""]
        buckets = split["breakdowns"][model]["user_activity"]["buckets"]
        rows = []
        for j, b in enumerate(buckets):
            rows.append(
                [
                    b["bucket"],
                    b["num_users_evaluated"],
                    *(split["breakdowns"][m]["user_activity"]["buckets"][j][key] for m in models),
                ]
            )
        out += _table(["training items", "users", *(_label(m, report) for m in models)], rows) + [""]
        out += [f"### Recall@{hk} by item popularity", ""]
        rows = []
        for j, b in enumerate(split["breakdowns"][model]["item_popularity"]["buckets"]):
            per_model = [split["breakdowns"][m]["item_popularity"]["buckets"][j] for m in models]
            rows.append(
                [b["bucket"], b["num_items"], b["train_interaction_share"], b["num_relevant_pairs"],
                 *(p[key] for p in per_model), *(p[f"topk_share@{hk}"] for p in per_model)]
            )  # fmt: skip
        header = ["bucket", "items", "train share", "held-out pairs", *(f"recall {_label(m, report)}" for m in models),
                  *(f"top-{hk} share {_label(m, report)}" for m in models)]  # fmt: skip
        out += _table(header, rows) + [""]
    out += [f"Buckets: {report['breakdown_definitions']['item_popularity']}.", ""]

    return out


def _stage(report: dict) -> list[str]:
    """Each ranker the evaluation stage ranked for the report, in its order: what it was fit on, its chosen point and
    valid grid; or why it was skipped."""
    stage = report.get("stage") or {"rankers": {}}
    out = ["## The evaluation stage's rankers", ""]
    if not stage["rankers"]:
        return out + ["None asked for (recsys.evaluate rankers=...).", ""]
    for name, row in stage["rankers"].items():
        out += _stage_row(name, row, stage.get("tuned_on", "valid"))
    return out


def _stage_row(name: str, row: dict, tuned_on: str) -> list[str]:
    label = ranker_label(name)
    out = [f"### {label}" + (f" (`{name}`)" if label != name else ""), ""]
    if "skipped" in row:
        return out + [f"{label} skipped: {row['skipped']}.", ""]
    point = ", ".join(f"{k} = {v:g}" if isinstance(v, (int, float)) else f"{k} = {v}" for k, v in row["point"].items())
    tuned_on = row.get("tuned_on", tuned_on)
    fit_on = row.get("fit_on", {})
    servable = "yes" if row.get("servable") else "no"
    out += [f"{point or 'no settings to tune'}, chosen by {tuned_on}; fitted on {fit_on.get('valid', '?')} for "
            f"valid and {fit_on.get('test', '?')} for test; servable by the bundle: {servable}.", ""]  # fmt: skip
    fit = row.get("fit", {}).get("test", {})
    details = [f"{key} {value}" for key, value in fit.items() if key not in ("fit_on", "seconds")]
    if details:
        out += [f"Test fit: {', '.join(details)}; {fit.get('seconds', 0):.0f} s.", ""]
    if row.get("grid"):
        metric = tuned_on.split()[1].rstrip(",") if len(tuned_on.split()) > 1 else tuned_on
        out += _table(["setting", f"valid {metric}"], [[k, v] for k, v in row["grid"].items()]) + [""]
    return out


def _ann(report: dict) -> list[str]:
    """FAISS indexes against exact search, or why they were not run."""
    model = report["model"]
    out: list[str] = []
    ann = report["ann"]
    out += ["## Approximate retrieval (FAISS)", ""]
    if "skipped" in ann:
        out += [f"Not run: {ann['skipped']}", ""]
    else:
        k = ann["k"]
        out += [
            f"{ann['split']} split, {ann['num_queries']:,} queries, top-{k}, masking as above; threads: {_fmt(ann['threads'])}. Batched = all queries in chunks; single query = median of queries searched one at a time.",
            "",
        ]
        rows = [["exact (torch)", 1.0, report["splits"][ann["split"]]["metrics"][model][f"recall@{k}"], None,
                 ann["exact"]["ms_per_query"], ann["exact"]["users_per_s"], ann["exact"]["single_query_ms"]]]  # fmt: skip
        for kind, e in ann["indexes"].items():
            rows.append([f"{kind} ({_fmt(e['params'])})" if e["params"] else kind, e["recall_vs_exact"], e["metrics"][f"recall@{k}"], e["build_s"],
                         e["ms_per_query"], e["users_per_s"], e["single_query_ms"]])  # fmt: skip
        out += _table(
            [
                "index",
                f"recall vs exact@{k}",
                f"recall@{k}",
                "build s",
                "ms/query (batched)",
                "users/s",
                "single query ms",
            ],
            rows,
        )
        out += [""]
        for kind, e in ann["indexes"].items():
            if e.get("nprobe_sweep"):
                out += [
                    f"{kind}: recall against speed as more of its {e['params']['nlist']} lists are scanned per query (nprobe = nlist scans all):",
                    "",
                ]
                out += _table(
                    ["nprobe", f"recall vs exact@{k}", "ms/query (batched)", "users/s"],
                    [
                        [p["nprobe"], p["recall_vs_exact"], p["ms_per_query"], p["users_per_s"]]
                        for p in e["nprobe_sweep"]
                    ],
                )
                out += [""]

    return out


def _closing(report: dict) -> list[str]:
    """The plot, "more like this", the recommendations file."""
    model = report["model"]
    out: list[str] = []
    out += ["## Recall vs K", "", "![recall at K](recall_at_k.png)", ""]
    if report["more_like_this"]:
        out += ["## More like this (cosine of item embeddings)", ""]
        for seed in report["more_like_this"]:
            near = ", ".join(f"{n['name']} ({n['cosine']:.2f})" for n in seed["nearest"])
            out.append(f"- **{seed['name']}** ({seed['train_count']:,} training interactions): {near}")
        out.append("")
    rec = report["recommendations"]
    out += [
        f"Per-user top-{rec['k']} of the {model} on {rec['split']}: `recommendations.parquet` ({rec['rows']:,} rows).",
        "",
    ]
    return out
