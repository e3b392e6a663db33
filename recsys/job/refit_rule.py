"""``trainer.refit=null``: whether a run trains its second stage on train + valid, decided by the training split's
size. The refit raised the served test figure on every dataset measured (docs/quality.md, "Epochs and the refit":
+1.1% and +0.8% on the 2,000-user samples of Gowalla and Yelp2018, +0.5% on full Gowalla) at the cost of a second
training; that training is seconds to a few minutes up to ``AUTO_REFIT_MAX_TRAIN_ROWS`` rows on 2 CPU cores, and
4-6 minutes a run on the full benchmarks (810k-1.2M rows), where it stays off."""

from __future__ import annotations

from recsys.config import Config, Protocol

AUTO_REFIT_MAX_TRAIN_ROWS = 250_000


def decide_refit(cfg: Config, train_rows: int, valid_rows: int) -> tuple[bool, str]:
    """(refit or not, why) for a run whose training split has ``train_rows`` rows and its valid split ``valid_rows``."""
    t, d = cfg.trainer, cfg.data
    if t.refit is not None:
        return t.refit, f"trainer.refit={str(t.refit).lower()}"
    if d.train_on_valid or d.slices or d.protocol == Protocol.strong_generalization or not valid_rows:
        return (
            False,
            "trainer.refit=null: no refit (no held-out valid rows to add: train_on_valid, slices, "
            "strong_generalization or an empty valid split)",
        )
    if train_rows <= AUTO_REFIT_MAX_TRAIN_ROWS:
        return True, (
            f"trainer.refit=null: a refit on train + valid after the selection, the training split's {train_rows:,} "
            f"rows being at most {AUTO_REFIT_MAX_TRAIN_ROWS:,} (a second training this short bought +0.8-1.1% on "
            "the samples measured: docs/quality.md); trainer.refit=false turns it off"
        )
    return False, (
        f"trainer.refit=null: no refit, the training split's {train_rows:,} rows being over "
        f"{AUTO_REFIT_MAX_TRAIN_ROWS:,} (a second full training for +0.5% on Gowalla: docs/quality.md); "
        "trainer.refit=true asks for it"
    )
