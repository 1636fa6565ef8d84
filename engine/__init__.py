"""The run path and the control plane over the store: project config, landing, normalizing,
guarding, deriving, models, runs, control and the DuckDB read path. The CLI is a thin layer over
functions importable from here, so a notebook can do everything the CLI does.
"""
