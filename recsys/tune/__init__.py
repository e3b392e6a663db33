"""The budgeted search on valid (``tune.budget_minutes``): trials proposed by Optuna, each a short training judged on
valid only, then the best settings trained as a normal run (search.py; the table of trials: trials_table.py)."""
