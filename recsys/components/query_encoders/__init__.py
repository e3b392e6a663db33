"""The query encoders, each a component (recsys/components/registry.py): a module here with its ``Config`` (chosen by
``model.query_encoder.name``; conf/model/query_encoder/<name>.yaml) saying how the query tower reads the history.

A query encoder's ``Config`` has, beside its settings:

    sequence                   whether it reads the history per position (the ``sequence`` key, looked up unpooled in
                               an item-sized table of ``dim`` columns) instead of as the item table's pooled bag; the
                               feature layout (recsys/data/layout.py) follows it, no caller compares names
    user                       whether its module also reads the user-id embedding (the user key's pooled columns,
                               ``B x D_u``) and returns a vector of that width in their place (gated)
    check(need, key, data)     its values' rules, with the data settings they depend on (``data``: a DataConfig)
    build(max_length, user_dim)  a sequence encoder's module (None for the pooled bag, which is the item table's
                               lookup); ``user_dim``: the user table's width, for an encoder that reads it

A sequence encoder's module maps ``(items B x L x D, lengths B) -> B x D`` (L <= ``max_length``, rows padded with
zeros after their ``lengths[b]`` items, oldest first; recsys.components.query_encoders.sequence.padded_history), or with ``user``
``(items, lengths, user B x D_u) -> B x D_u``, and has ``max_length``; its output joins the query tower's input
before the pooled query columns (recsys/model/two_tower.py).
"""

PACKAGE = __name__
