"""The public Python API: open a project, run its pipelines, build its models, publish its exports,
and read every table and model through DuckDB.

A :class:`Project` is a project directory (holding ``contextful.toml``) with its manifest read and
validated and its store opened; close it (or use it in a ``with`` block) to release the store. The
functions beside it do the same work for one call each:

    import contextful

    with contextful.open_project("path/to/project") as project:
        project.run()                                  # every pipeline, in dependency order
        project.build()                                # every model, each after what it reads
        con = project.connect()                        # a DuckDB connection: a view per table
        print(con.sql("SELECT count(*) FROM events").fetchall())

    con = contextful.connect("path/to/project", as_of="2026-11-01T00:00:00Z")   # time travel

Errors are the catalogue's (``contextful.errors``): a failed input of a run is reported in its
result, not raised; a build or export that fails raises its named error.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from contextful.storage import Store

if TYPE_CHECKING:
    import duckdb

    from contextful.engine.config.manifest import Manifest
    from contextful.engine.export.run import ExportRunResult
    from contextful.engine.land.results import PipelineResult
    from contextful.engine.model.build import BuildResult

PathLike = str | os.PathLike[str]


class Project:
    """A project directory: its manifest (validated when opened) and its store."""

    def __init__(self, manifest: Manifest, store: Store) -> None:
        self.manifest = manifest
        """The parsed ``contextful.toml``."""
        self.store = store
        """The project's store (``[project].store``, default ``.contextful/store``)."""

    @property
    def root(self) -> Path:
        """The project directory."""
        return self.manifest.root

    def run(self, pipelines: list[str] | None = None) -> list[PipelineResult]:
        """Run the named pipelines (default: all) in dependency order; each result says what landed
        and which inputs failed (by name)."""
        from contextful.engine.run.units import run_pipelines as run

        return run(self.store, self.manifest, pipelines)

    def build(self, models: list[str] | None = None) -> list[BuildResult]:
        """Build the named models (default: all), each after the models it reads."""
        from contextful.engine.model.build import build_models

        return build_models(self.store, self.manifest, models)

    def export(self, exports: list[str] | None = None) -> list[ExportRunResult]:
        """Publish the named exports (default: all) to their Iceberg tables."""
        from contextful.engine.export.run import run_exports

        return run_exports(self.store, self.manifest, exports)

    def connect(self, as_of: str | datetime | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table and model, pinned at one point (or ``as_of``)."""
        from contextful.engine.read import connect as read

        return read(self.store, as_of)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_project(path: PathLike = ".", *, store: str | None = None) -> Project:
    """The project at or above ``path``, found as the ``contextful`` command finds it
    (``ProjectNotFound`` when there is none), its manifest validated (``ManifestInvalid`` lists
    every problem) and its store opened, created on first use as ``pipeline run`` creates it
    (``store``, a path or fsspec URL, overrides the project's)."""
    from contextful.engine.config import load_manifest
    from contextful.engine.project import open_project_store

    manifest = load_manifest(path)
    return Project(manifest, open_project_store(manifest.root, store, project=manifest.project, create=True))


def open_store(project_or_store: PathLike | None = None) -> Store:
    """An existing store, for reading: the store of the project at or above a directory, or the
    store at a root path or fsspec URL (``None``: ``CONTEXTFUL_STORE``, else the project around the
    working directory). It never creates one: ``StoreNotFound`` / ``ProjectNotFound`` name what is missing."""
    from contextful.engine.project import open_store as open_

    return open_(project_or_store)


def connect(project_or_store: Project | Store | PathLike | None = None,
            as_of: str | datetime | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where every table and model is a view, all pinned at one point: the
    heads now, or ``as_of`` a transaction time (ISO-8601 text or a datetime)."""
    from contextful.engine.read import connect as read

    target: Store | PathLike | None = project_or_store.store if isinstance(project_or_store, Project) else project_or_store
    return read(target, as_of)


def attach_build(con: duckdb.DuckDBPyConnection, project_or_store: Project | Store, model: str, build_id: int,
                 view: str | None = None) -> str:
    """Add to ``con`` a view answering build ``build_id`` of ``model`` (named ``<model>@<build_id>``
    unless ``view`` says otherwise) and return its name: a build that is no longer the latest stays
    readable until collection removes it (``SnapshotNotFound`` when the model has no such build)."""
    from contextful.engine.read import model_build

    store = project_or_store.store if isinstance(project_or_store, Project) else project_or_store
    return model_build(con, store, model, build_id, view)


def run_pipelines(path: PathLike = ".", pipelines: list[str] | None = None) -> list[PipelineResult]:
    """Open the project at ``path``, run the named pipelines (default: all), close it."""
    with open_project(path) as project:
        return project.run(pipelines)


def build(path: PathLike = ".", models: list[str] | None = None) -> list[BuildResult]:
    """Open the project at ``path``, build the named models (default: all), close it."""
    with open_project(path) as project:
        return project.build(models)


def export(path: PathLike = ".", exports: list[str] | None = None) -> list[ExportRunResult]:
    """Open the project at ``path``, publish the named exports (default: all), close it."""
    with open_project(path) as project:
        return project.export(exports)
