"""The two-tower of a checkpoint, served alone: what ``recsys.export`` ships when the run dir has no served ranker
(``checkpoint=PATH`` names other weights than the best epoch's, or the run predates served/)."""

from __future__ import annotations

import numpy as np

from recsys.data.dataset import RetrievalData
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.layout import FeatureLayout
from recsys.distributed.env import DistEnv
from recsys.rankers.served import Served
from recsys.rankers.two_tower.part import TwoTowerPart
from recsys.ranking.sharded import embed
from recsys.ranking.untrained import unranked_items


def served_from_weights(layout: FeatureLayout, data: RetrievalData, model, env: DistEnv, batch_size: int) -> Served:
    """Collective: the model's item embeddings (the keys of the run's ``layout``), every rank embedding its share
    (the query encoder comes with the bundle); with managed ids the items the tables do not hold are left out, as a
    run ranks them."""
    items = embed(
        model, FeatureBuilder(data, layout=layout), side="candidate", ids=np.arange(data.num_items), timeline=None,
        batch_size=batch_size, device=env.device, rank=env.rank, world_size=env.world_size,
    )  # fmt: skip
    unranked = unranked_items(data, model, device=env.device, world_size=env.world_size)
    return Served([TwoTowerPart(items, unranked)], [1.0])
