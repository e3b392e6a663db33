"""The two-tower of a checkpoint, served alone: what ``recsys.export`` ships when the run dir has no served ranker
(``checkpoint=PATH`` names other weights than the best epoch's, or the run predates served/)."""

from __future__ import annotations

import numpy as np

from recsys.config import Config
from recsys.data.dataset import RetrievalData
from recsys.data.feature_builder import run_feature_builder
from recsys.distributed.env import DistEnv
from recsys.rankers.served import Served
from recsys.rankers.two_tower.part import TwoTowerPart
from recsys.ranking.sharded import embed
from recsys.ranking.untrained import unranked_items


def served_from_weights(cfg: Config, data: RetrievalData, model, env: DistEnv, batch_size: int) -> Served:
    """Collective: the model's item embeddings, every rank embedding its share (the query encoder comes with the
    bundle); with managed ids the items the tables do not hold are left out, as a run ranks them."""
    items = embed(
        model, run_feature_builder(cfg, data), side="candidate", ids=np.arange(data.num_items), timeline=None,
        batch_size=batch_size, device=env.device, rank=env.rank, world_size=env.world_size,
    )  # fmt: skip
    unranked = unranked_items(data, model, device=env.device, world_size=env.world_size)
    return Served([TwoTowerPart(items, unranked)], [1.0])
