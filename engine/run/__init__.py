"""The run substrate: executions keyed on a scope and a content-hashed plan, journaled steps,
retry schedules, and (later) awakeables and cancellation, over the storage ports in ``storage``."""
