"""The mean-pooled bag of the history's items, looked up in the item table (every protocol and history kind)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    name: str = "bag"  # model/query_encoder=bag (conf/model/query_encoder/bag.yaml) chooses it

    @property
    def sequence(self) -> bool:
        return False  # the history is the item key's pooled query rows

    @property
    def user(self) -> bool:
        return False  # the tower reads the user id (if any) beside it

    def check(self, need, key: str, data) -> None:
        pass  # no settings; a run without a history reads the user id alone

    def build(self, max_length: int, user_dim: int = 0) -> None:
        return None  # the bag is the item table's pooled lookup (recsys/model/two_tower.py): nothing of its own
