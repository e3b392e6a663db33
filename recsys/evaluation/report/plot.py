"""recall_at_k.png: Recall@K for K = 1..max(ks), one panel per split, one line per model (matplotlib's Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from recsys.rankers.registry import ranker_label
from recsys.utils.atomic import write_atomic


def plot_recall_at_k(curves: dict[str, dict[str, np.ndarray]], ks: Sequence[int], path: Path, model: str) -> None:
    """recall_at_k.png: one panel per split, Recall@K for K = 1..max(ks), a line per model, dots at ks."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no display, no pyplot state
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * max(len(curves), 1), 4.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(len(curves), 1), squeeze=False)[0]
    for ax, (split, per_model) in zip(axes, curves.items()):
        for m, curve in per_model.items():
            x = np.arange(1, curve.shape[0] + 1)
            (line,) = ax.plot(x, curve, label=ranker_label(m), linewidth=2.2 if m == model else 1.4)
            at = [k - 1 for k in ks if k <= curve.shape[0]]
            ax.plot(x[at], curve[at], "o", color=line.get_color(), markersize=3.5)
        ax.set_title(f"{split}: full ranking, seen items masked")
        ax.set_xlabel("K")
        ax.set_ylabel("Recall@K")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png")

    write_atomic(path, save)
