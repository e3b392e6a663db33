"""Rankers: the two-tower and the baselines behind one protocol (``base``), built by name (``registry``), ranked
by the evaluation stage (``recsys.evaluation.stage``); ``served`` keeps what the bundle ships."""
