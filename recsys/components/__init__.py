"""Components: the training losses and the query encoders, each one module with its ``Config`` and ``build()``, chosen
by name in conf/model/ (registry.py finds them); they import nothing from the config or the model that uses them."""
