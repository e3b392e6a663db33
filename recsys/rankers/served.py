"""The served ranker: its parts (recsys/rankers/parts.py) and how they combine, as the run measured it.

One part is served as it is; several are fused (recsys/rankers/spread.py: each part's query over its scores' spread,
times its weight, the items side by side), one inner product again. The same object ranks in the run, is saved in
the run dir, and is written into the bundle::

    <folder>/parts/<i>-<ranker>/   each part (``ServedPart.save``: items.npy, unranked.npy, its own files)
    <folder>/fusion/covariance_<i>.npy  float64 [D_i, D_i]: each part's item covariance (several parts only)

The evaluation stage keeps it in the run dir (recsys/rankers/served_dir.py); ``recsys.export`` writes it into the
bundle (recsys/serving/bundle_writer.py), which ``load_bundle`` reads back (recsys/serving/bundle.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from recsys.rankers.parts import BundleRun, Catalogue, Query, ServedPart, either, part_type
from recsys.rankers.spread import fuse_queries, item_covariance
from recsys.utils.safe_load import numpy_load

PARTS_DIR, FUSION_DIR = "parts", "fusion"


class Served:
    """The served ranker: ``parts`` and their ``weights`` (one part: [1.0]); its items are the parts' side by side."""

    def __init__(
        self, parts: Sequence[ServedPart], weights: Sequence[float], covariances: Sequence[torch.Tensor] | None = None
    ) -> None:
        if len(parts) != len(weights) or not parts:
            raise ValueError(f"served ranker: {len(parts)} parts and {len(weights)} weights")
        self.parts, self.weights = list(parts), [float(w) for w in weights]
        fused = len(self.parts) > 1
        self.covariances = list(covariances or [item_covariance(p.items) for p in self.parts]) if fused else []

    @property
    def name(self) -> str:
        return "+".join(p.ranker for p in self.parts)

    @property
    def reads_users(self) -> bool:
        """Whether any part's queries read the user (``ServedPart.reads_users``)."""
        return any(p.reads_users for p in self.parts)

    def items(self) -> torch.Tensor:
        """float32 [I, sum of the parts' D]."""
        return (
            torch.cat([p.items for p in self.parts], dim=1).contiguous() if len(self.parts) > 1 else self.parts[0].items
        )

    def unranked(self) -> torch.Tensor | None:
        """bool [I]: items any part leaves out (never recommended), None when none."""
        return either([p.unranked for p in self.parts])

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        """float32 [B, D]: the queries' vectors, ranked by <query, items()>."""
        if len(self.parts) == 1:
            return self.parts[0].encode(query, catalogue)
        return fuse_queries([p.encode(query, catalogue) for p in self.parts], self.covariances, self.weights)

    def part(self, ranker: str) -> ServedPart:
        """The part serving ``ranker`` (a KeyError naming the parts when there is none)."""
        for p in self.parts:
            if p.ranker == ranker:
                return p
        raise KeyError(f"no part {ranker!r} in the served ranker {self.name!r}")

    def for_bundle(self, run: BundleRun) -> Served:
        return Served([p.for_bundle(run) for p in self.parts], self.weights, self.covariances or None)

    def save(self, folder: Path) -> dict:
        """Write parts/ (and fusion/) into ``folder``; returns {"parts": entries, "weights": [...]}."""
        entries = []
        for i, p in enumerate(self.parts):
            name = f"{i}-{p.ranker}"
            entries.append({**p.save(folder / PARTS_DIR / name), "dir": f"{PARTS_DIR}/{name}"})
        for i, c in enumerate(self.covariances):
            (folder / FUSION_DIR).mkdir(parents=True, exist_ok=True)
            np.save(folder / FUSION_DIR / f"covariance_{i}.npy", c.numpy().astype(np.float64))
        return {"parts": entries, "weights": self.weights}

    @classmethod
    def load(cls, folder: Path, meta: dict, where: str) -> Served:
        """The served ranker ``save`` wrote into ``folder`` (``meta``: what it returned; ``where``: the file that
        holds it, for errors). Each part through its registered type."""
        parts = [part_type(e["ranker"], where).load(folder / e["dir"], e) for e in meta["parts"]]
        covariances = None
        if len(parts) > 1:
            covariances = [
                torch.from_numpy(numpy_load(folder / FUSION_DIR / f"covariance_{i}.npy")) for i in range(len(parts))
            ]
        return cls(parts, meta["weights"], covariances)
