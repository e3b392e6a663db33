"""The collector each section's check reports to (``check_values`` joins what it collected into one refusal)."""

from collections.abc import Callable
from typing import Any

Need = Callable[[bool, str, Any, str], None]  # need(ok, key, value, rule): refuse "key=value: rule" unless ok
