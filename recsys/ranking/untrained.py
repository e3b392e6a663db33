"""Never-trained ids: which test users and items a run's weights hold nothing of their own for, said by the run
(console, train.log, results.json ``untrained``), and the items the two-tower leaves out of its ranking.

    untrained = find_untrained(data, two_tower, managed=..., device=..., world_size=...)   # collective
    counts = count_untrained(untrained, users, relevant)     # one split's users; results.json "untrained"

Managed tables (model.id_mapping=managed): an id is trained when its table holds it after training. Every id a
table does not hold reads the table's one shared row of zeros (recsys/distributed/managed.py), so never-trained items
with the same features score alike: a tie that only the order of their ids would break. The two-tower (and a fusion
with it) leaves them out of its ranking, its top-k holding trained items only (fewer than k where fewer are left),
and its bundle never recommends them; a run that trains on them (the next slice) ranks them.

Vocabulary tables: every id has a row of its own, drawn at random until trained, so nothing ties; an id with no row
in the training split is counted as never trained and ranked as the model scores it. A model without a user table
counts users that way too (a user is then only their history).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from recsys.data.dataset import RetrievalData
from recsys.data.raw_ids import KEY_SPACE, hash_keys_numpy
from recsys.distributed.managed import sharded_managed
from recsys.ranking.interactions import UserItemCSR

log = logging.getLogger(__name__)

HELD_RULE = "not held by the managed table (they share its one row of zeros)"
NO_ROWS_RULE = "no interaction in the training split"


@dataclass(frozen=True)
class Untrained:
    users: np.ndarray  # bool [num_users]: users the weights hold nothing of their own for
    items: np.ndarray  # bool [num_items]
    user_rule: str  # what "never trained" means for users (HELD_RULE or NO_ROWS_RULE)
    item_rule: str
    left_out: bool  # the two-tower leaves the never-trained items out of its ranking (managed item tables)

    def unranked_items(self) -> torch.Tensor | None:
        """bool [I] of the items the two-tower does not rank, or None when it ranks every item."""
        return torch.from_numpy(self.items.copy()) if self.left_out and self.items.any() else None


def held_ids(two_tower: nn.Module, table: str, raw_ids: np.ndarray, device: torch.device, world_size: int):
    """Collective: bool [n], whether the managed ``table`` holds each raw id (each rank holds its key range's);
    None when the model has no such managed table."""
    for sharded in sharded_managed(two_tower):
        modules = sharded._managed_collision_collection._managed_collision_modules
        if table not in modules:
            continue
        keys = modules[table]._mch_sorted_raw_ids.cpu().numpy()
        held = torch.from_numpy(np.isin(hash_keys_numpy(raw_ids), keys[keys != KEY_SPACE]).astype(np.uint8))
        if world_size > 1:
            held = held.to(device)
            dist.all_reduce(held, op=dist.ReduceOp.MAX)
        return held.cpu().numpy().astype(bool)
    return None


def find_untrained(
    data: RetrievalData, two_tower: nn.Module, *, managed: bool, device: torch.device, world_size: int
) -> Untrained:
    """Collective: the users and items ``two_tower``'s weights never trained (module docstring)."""
    held_users = held_ids(two_tower, "user", data.raw_user_ids, device, world_size) if managed else None
    if held_users is not None:  # a managed user table (model.query_user_id)
        users, user_rule = ~held_users, HELD_RULE
    else:
        users, user_rule = np.bincount(data.splits["train"].user_ids, minlength=data.num_users) == 0, NO_ROWS_RULE
    held_items = held_ids(two_tower, "item", data.raw_item_ids, device, world_size) if managed else None
    if held_items is not None:
        return Untrained(users, ~held_items, user_rule, HELD_RULE, left_out=True)
    # the whole split's counts, also where this rank reads its own users only
    return Untrained(users, data.item_counts() == 0, user_rule, NO_ROWS_RULE, left_out=False)


def unranked_items(
    data: RetrievalData, two_tower: nn.Module, *, device: torch.device, world_size: int
) -> torch.Tensor | None:
    """Collective: bool [I], the items the two-tower leaves out (those its managed item table does not hold); None
    when it ranks every item (vocabulary tables, or a managed table that holds them all)."""
    if data.raw_item_ids is None:  # vocabulary tables: every item has a row of its own
        return None
    held = held_ids(two_tower, "item", data.raw_item_ids, device, world_size)
    return None if held is None or held.all() else torch.from_numpy(~held)


def count_untrained(untrained: Untrained, users: np.ndarray, relevant: UserItemCSR, reduce=None) -> dict:
    """results.json's ``untrained`` of one split: its users (int64 [U]) and their held-out items (``relevant``,
    rows in the order of ``users``) never trained. ``reduce``: sums int64 tensors over the ranks that hold the
    split's users between them (data.shard_by_user), None when this process holds them all."""
    test_items = np.zeros(len(untrained.items), dtype=np.int64)
    test_items[relevant.indices] = 1
    counts = torch.tensor(
        [
            int(untrained.users[users].sum()),
            len(users),
            int(untrained.items[relevant.indices].sum()),
            len(relevant.indices),
        ],
        dtype=torch.int64,
    )
    seen = torch.from_numpy(test_items)
    if reduce is not None:  # an item may be one rank's and another's: summed flags, then > 0
        counts, seen = reduce(counts), reduce(seen)
    seen_items = seen.numpy() > 0
    never_users, num_users, never_rows, num_rows = (int(v) for v in counts)
    return {
        "users": {"never_trained": never_users, "of": num_users, "rule": untrained.user_rule},
        "items": {
            "never_trained": int((seen_items & untrained.items).sum()),
            "of": int(seen_items.sum()),
            "rule": untrained.item_rule,
        },
        "interactions": {"never_trained_item": never_rows, "of": num_rows},
        # the catalogue's items the two-tower does not rank (its top-k holds trained items only)
        "left_out_of_two_tower": int(untrained.items.sum()) if untrained.left_out else 0,
    }


def say_untrained(split: str, counts: dict) -> None:
    """The run's line on the console and in train.log: how many of ``split``'s users and items were never trained."""
    users, items, rows = counts["users"], counts["items"], counts["interactions"]
    if not (users["never_trained"] or items["never_trained"]):
        log.info("%s: every user and item was trained", split)
        return
    left_out = counts["left_out_of_two_tower"]
    log.warning(
        "%s: %d of %d users and %d of %d items (%d of %d interactions) were never trained (items: %s; users: %s); %s",
        split,
        users["never_trained"],
        users["of"],
        items["never_trained"],
        items["of"],
        rows["never_trained_item"],
        rows["of"],
        items["rule"],
        users["rule"],
        f"the two-tower leaves the {left_out} never-trained items of the catalogue out of its ranking"
        if left_out
        else "they are ranked by their untrained rows",
    )
