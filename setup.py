"""The install layout: one import namespace, ``contextful``, over the repository's top-level packages.

The repository keeps ``engine/``, ``storage/``, ``iceberg/`` and ``datasets/`` at its top (the
product's layout); installed, they are ``contextful.engine``, ``contextful.storage``,
``contextful.iceberg`` and ``contextful.datasets``, and nothing else lands in site-packages.
Everything else about the distribution is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("engine", "storage", "iceberg", "datasets")

setup(
    packages=["contextful"] + [f"contextful.{name}" for name in find_packages(include=[f"{m}*" for m in MAPPED])],
    package_dir={"contextful": "contextful", **{f"contextful.{m}": m for m in MAPPED}},
    # the operator console's page, script and style sheet (engine/served/console_routes.py serves them)
    package_data={"contextful.datasets": ["samples/*.ndjson"], "contextful.engine.served": ["console/*"]},
)
