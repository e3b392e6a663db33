"""The training losses, each a component (recsys/components/registry.py): a module here with its ``Config`` (chosen by
``model.loss.name``; conf/model/loss/<name>.yaml) whose ``build()`` returns the loss module.

A loss module's ``forward(queries, candidates, *, labels, query_item_ids, candidate_item_ids, log_q)``::

    queries     B_q x D  unit-norm query vectors (this rank's)
    candidates  C x D    unit-norm candidate vectors: every rank's positives, then the batch's sampled negatives
    labels      B_q      the column of each query's positive
    *_item_ids  B_q, C   items, for masking accidental hits (a candidate whose item is the query's positive)
    log_q       C        log-probability that each candidate is drawn as one (recsys.model.task), for logQ

returns the mean loss over the queries (a scalar).
"""

PACKAGE = __name__
