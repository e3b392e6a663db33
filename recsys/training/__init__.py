"""The training loop (the Trainer: steps, per-epoch validation, early stopping, checkpoints) and its
learning-rate schedule."""
