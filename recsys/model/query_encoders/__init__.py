"""The query encoders, each a component (recsys/model/components.py): a module here with its ``Config`` (chosen by
``model.query_encoder.name``; conf/model/query_encoder/<name>.yaml) saying how the query tower reads the history.

A query encoder's ``Config`` has, beside its settings:

    sequence                   whether it reads the history per position (the ``sequence`` key, looked up unpooled in
                               an item-sized table of ``dim`` columns) instead of as the item table's pooled bag; the
                               feature layout (recsys/data/layout.py) follows it, no caller compares names
    check(need, key, data)     its values' rules, with the data settings they depend on (``data``: a DataConfig)
    build(max_length)          a sequence encoder's module (None for the pooled bag, which is the item table's lookup)

A sequence encoder's module maps ``(items B x L x D, lengths B) -> B x D`` (L <= ``max_length``, rows padded with
zeros after their ``lengths[b]`` items, oldest first; recsys.model.sequence.padded_history) and has ``max_length``;
its output joins the query tower's input before the pooled query columns (recsys/model/two_tower.py).
"""

PACKAGE = __name__
