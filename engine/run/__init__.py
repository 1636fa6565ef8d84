"""The run substrate: executions keyed on a scope and a content-hashed plan, journaled steps,
retry schedules, awakeables (``awakeable.py``) and (later) cancellation, over the storage ports in
``storage``."""
