"""The run's assembly: one training and its evaluation stage (run.py), the checks made before any work, the
refit rule and the sweep's summary."""
