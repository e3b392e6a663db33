"""The training losses, each a component (recsys/components/registry.py): a module here with its ``Config`` (chosen by
``model.loss.name``; conf/model/loss/<name>.yaml) whose ``build()`` returns the loss module.

A loss module's ``forward(queries, candidates, *, labels, query_item_ids, candidate_item_ids, log_q, unit_dims)``::

    queries     B_q x D  query vectors (this rank's): unit-norm in their first ``unit_dims`` columns
    candidates  C x D    candidate vectors: every rank's positives, then the batch's sampled negatives; unit-norm in
                         their first ``unit_dims`` columns (with model.item_bias the last column is the item's bias,
                         and the queries' a constant 1)
    labels      B_q      the column of each query's positive
    *_item_ids  B_q, C   items, for masking accidental hits (a candidate whose item is the query's positive)
    log_q       C        log-probability that each candidate is drawn as one (recsys.model.task), for logQ
    unit_dims   int      D, or D - 1 with the item bias

returns the mean loss over the queries (a scalar).
"""

PACKAGE = __name__
