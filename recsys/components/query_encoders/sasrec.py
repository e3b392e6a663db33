"""SASRec: the history's items in time order through pre-LN transformer blocks (recsys/components/query_encoders/sequence.py).

The items (oldest -> newest, at most data.history_length) are looked up per position in a table of their own
(``sequence``: item-sized, fused optimizer like the others), plus a learned embedding of each item's recency; the
newest item's output (a learned vector for a user without history) joins the query tower's other inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from recsys.components.query_encoders.sequence import SequenceEncoder


@dataclass
class Config:
    name: str = "sasrec"  # model/query_encoder=sasrec (conf/model/query_encoder/sasrec.yaml) chooses it
    dim: int = 64  # columns of the sequence table = the blocks' width
    num_layers: int = 2  # transformer encoder blocks
    num_heads: int = 1  # attention heads per block; must divide dim
    dropout: float = 0.2  # on the inputs and inside each block (SASRec's 0.2 for dense data); 0 disables

    @property
    def sequence(self) -> bool:
        return True

    @property
    def user(self) -> bool:
        return False  # the tower reads the user id (if any) beside it

    def check(self, need, key: str, data) -> None:
        need(
            data.query_history == "recent" and data.history_length > 0,
            f"{key}.name",
            self.name,
            "reads the history in time order: needs data.query_history=recent and data.history_length > 0 "
            f"(got data.query_history={str(data.query_history)!r}, data.history_length={data.history_length})",
        )
        need(self.dim >= 1, f"{key}.dim", self.dim, "must be >= 1")
        need(self.num_layers >= 1, f"{key}.num_layers", self.num_layers, "must be >= 1")
        need(
            self.num_heads >= 1 and self.dim % max(self.num_heads, 1) == 0,
            f"{key}.num_heads",
            self.num_heads,
            f"must be >= 1 and divide {key}.dim={self.dim}",
        )
        need(0.0 <= self.dropout < 1.0, f"{key}.dropout", self.dropout, "must be in [0, 1)")

    def build(self, max_length: int, user_dim: int = 0) -> SequenceEncoder:
        return SequenceEncoder(
            self.dim, max_length, num_layers=self.num_layers, num_heads=self.num_heads, dropout=self.dropout
        )
