"""Corpora for the gateway's SQL sandbox: hostile statements built from attack classes, and legitimate ones.

:func:`hostile` crosses *targets* (something a reader must not reach: a file, a setting, the
catalog, the environment, another namespace) with *wrappers* (where in a statement the target
hides: CTE bodies and CTE shadowing at several depths, subqueries, set operations, lateral joins,
table-function arguments, comments, quoting, case and unicode tricks). Every statement of the
relation and expression classes parses as one SELECT — DuckDB's parser accepts it — so its
refusal is the checker's decision, not a syntax error. :data:`STATEMENTS` adds what is not a
SELECT at all (pragmas, ATTACH, COPY, SET, several statements).

:data:`LEGIT` holds analytic SELECTs over the test project's ``orders`` (day, region, amount) and
``regions`` (region, name) that the gateway must admit and answer as DuckDB does.
"""

from __future__ import annotations

from pathlib import Path


def _relation_targets(secret: Path) -> dict[str, tuple[str, str]]:
    """name -> (a FROM item reaching something forbidden, the name a CTE would shadow it with)."""
    s = str(secret)
    return {
        "read_csv": (f"read_csv('{s}')", "read_csv"),
        "read_csv upper case": (f"READ_CSV('{s}')", "READ_CSV"),
        "read_csv quoted": (f"\"read_csv\"('{s}')", "read_csv"),
        "read_csv homoglyph": (f"r\u0435ad_csv('{s}')", "r\u0435ad_csv"),
        "read_text": (f"read_text('{s}')", "read_text"),
        "read_blob": (f"read_blob('{s}')", "read_blob"),
        "read_parquet": (f"read_parquet('{s}.parquet')", "read_parquet"),
        "read_json_auto": (f"read_json_auto('{s}')", "read_json_auto"),
        "replacement scan": (f"'{s}'", s),
        "replacement scan quoted": (f"\"{s}\"", s),
        "replacement scan with alias": (f"'{s}' AS orders", s),
        "glob": ("glob('/*')", "glob"),
        "duckdb_settings": ("duckdb_settings()", "duckdb_settings"),
        "duckdb_tables": ("duckdb_tables()", "duckdb_tables"),
        "duckdb_extensions": ("duckdb_extensions()", "duckdb_extensions"),
        "information_schema": ("information_schema.tables", "tables"),
        "pg_catalog": ("pg_catalog.pg_class", "pg_class"),
        "sqlite_master": ("sqlite_master", "sqlite_master"),
        "another namespace": ("fin.orders", "orders"),
        "catalog qualified": ("memory.main.orders", "orders"),
        "query()": ("query('SELECT 1')", "query"),
        "pragma_table_info": ("pragma_table_info('orders')", "pragma_table_info"),
        "sniff_csv": (f"sniff_csv('{s}')", "sniff_csv"),
    }


def _expression_targets(secret: Path) -> dict[str, str]:
    return {
        "current_setting": "current_setting('enable_external_access')",
        "getenv": "getenv('HOME')",
        "getvariable": "getvariable('x')",
        "version": "version()",
        "current_database": "current_database()",
        "current_user bare": "current_user",
        "json_serialize_plan": "json_serialize_plan('SELECT 1')",
        "list_aggregate by name": "list_aggregate([1], 'min')",
        "qualified function": "main.abs(1)",
        "system function": "system.main.current_setting('threads')",
        "cast to a catalog type": "CAST(1 AS main.t)",
        "a file in a scalar subquery": f"(SELECT count(*) FROM read_text('{secret}'))",
        "a path in a scalar subquery": f"(SELECT count(*) FROM '{secret}')",
        "getenv upper case": "GETENV('HOME')",
        "getenv homoglyph": "g\u0435tenv('HOME')",
    }


_RELATION_WRAPPERS = (
    "SELECT * FROM {r}",
    "SELECT * FROM orders, {r}",
    "SELECT * /* a comment */ FROM -- another\n {r}",
    "SELECT * FROM (SELECT * FROM {r}) s",
    "SELECT * FROM orders WHERE EXISTS (SELECT 1 FROM {r})",
    "SELECT (SELECT count(*) FROM {r})",
    "SELECT day FROM orders UNION ALL SELECT NULL FROM {r}",
    "SELECT * FROM orders, LATERAL (SELECT * FROM {r}) l",
    "SELECT * FROM orders JOIN {r} ON true",
    "WITH a AS (SELECT * FROM {r}) SELECT * FROM a",
    "WITH a AS (WITH b AS (SELECT * FROM {r}) SELECT * FROM b) SELECT * FROM a",
    "WITH RECURSIVE x AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM x, {r} WHERE n < 2) SELECT * FROM x",
    "SELECT * FROM range((SELECT count(*) FROM {r}))",
    "SELECT * FROM (VALUES ((SELECT 1 FROM {r}))) v(x)",
    # CTE shadowing: a CTE of the target's name defined where the reference cannot see it.
    "SELECT * FROM (WITH \"{n}\" AS (SELECT 1) SELECT 1) t, {r}",
    "SELECT * FROM orders WHERE EXISTS (WITH \"{n}\" AS (SELECT 1) SELECT 1) AND EXISTS (SELECT 1 FROM {r})",
    "(WITH \"{n}\" AS (SELECT 1) SELECT 1) UNION ALL SELECT 1 FROM {r}",
    "WITH a AS (WITH \"{n}\" AS (SELECT 1) SELECT 1) SELECT * FROM a, {r}",
    "WITH \"{n}\" AS (SELECT * FROM {r}) SELECT * FROM \"{n}\"",
    "WITH a AS (SELECT * FROM {r}), \"{n}\" AS (SELECT 1) SELECT * FROM a",
)

_EXPRESSION_WRAPPERS = (
    "SELECT {e}",
    "SELECT {e} FROM orders",
    "SELECT * FROM orders WHERE {e} IS NOT NULL",
    "SELECT * FROM orders ORDER BY {e}",
    "WITH a AS (SELECT {e} AS v) SELECT * FROM a",
    "SELECT sum(amount) OVER (PARTITION BY {e}) FROM orders",
    "SELECT CASE WHEN true THEN {e} END",
    "SELECT list_transform([1], lambda x: {e})",
    "SELECT * FROM orders, LATERAL (SELECT {e}) l",
    "SELECT count(*) FILTER (WHERE {e} IS NULL) FROM orders",
)

STATEMENTS = (
    "PRAGMA version",
    "PRAGMA table_info('orders')",
    "ATTACH '/tmp/x.db' AS x",
    "COPY orders TO '/tmp/out.csv'",
    "COPY (SELECT 1) TO '/tmp/out.csv'",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "INSTALL httpfs",
    "LOAD httpfs",
    "CREATE TABLE x AS SELECT 1",
    "CREATE SECRET (TYPE s3)",
    "EXPORT DATABASE '/tmp/dump'",
    "CALL duckdb_settings()",
    "DESCRIBE orders",
    "SUMMARIZE orders",
    "SHOW TABLES",
    "EXPLAIN SELECT 1",
    "PIVOT orders ON region USING sum(amount)",
    "SELECT 1; SELECT 2",
    "SELECT * FROM orders; DROP TABLE orders",
    "SELECT 1; PRAGMA version",
    "DETACH memory",
    "USE system",
    "CHECKPOINT",
    "SELECT * FROM orders PIVOT (sum(amount) FOR region IN ('n', 's'))",
    "SELECT * FROM orders USING SAMPLE 1",
    "SELECT * FROM orders AT (VERSION => 1)",
)


def hostile(secret: Path) -> dict[str, str]:
    """Every distinct hostile SELECT, mapped to its attack class (target and wrapper)."""
    found: dict[str, str] = {}
    for name, (relation, shadow) in _relation_targets(secret).items():
        for i, wrapper in enumerate(_RELATION_WRAPPERS):
            found.setdefault(wrapper.format(r=relation, n=shadow.replace('"', '""')), f"relation {name} / wrapper {i}")
    for name, expression in _expression_targets(secret).items():
        for i, wrapper in enumerate(_EXPRESSION_WRAPPERS):
            found.setdefault(wrapper.format(e=expression), f"expression {name} / wrapper {i}")
    return found


LEGIT = (
    "SELECT * FROM orders",
    "SELECT day, region, amount FROM orders ORDER BY amount DESC LIMIT 2",
    "SELECT region, sum(amount) AS total, count(*) AS n, avg(amount) AS mean FROM orders GROUP BY region",
    "SELECT o.day, r.name, o.amount FROM orders o JOIN regions r USING (region)",
    ("SELECT r.name, coalesce(sum(o.amount), 0) AS total FROM regions r LEFT JOIN orders o ON o.region = r.region "
     "GROUP BY r.name"),
    ("SELECT day, amount, sum(amount) OVER (ORDER BY day, region ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) "
     "AS running FROM orders"),
    ("SELECT day, region, row_number() OVER (PARTITION BY region ORDER BY day) AS rn, "
     "lag(amount) OVER (PARTITION BY region ORDER BY day) AS previous FROM orders"),
    "SELECT day, region, amount FROM orders QUALIFY row_number() OVER (PARTITION BY region ORDER BY amount DESC) = 1",
    ("WITH daily AS (SELECT day, sum(amount) AS total FROM orders GROUP BY day) "
     "SELECT day, total, total - lag(total) OVER (ORDER BY day) AS change FROM daily"),
    ("WITH Daily AS (SELECT day, sum(amount) AS total FROM orders GROUP BY day), "
     "top AS (SELECT * FROM daily WHERE total > 10) SELECT count(*) FROM top"),
    ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) "
     "SELECT i, (SELECT sum(amount) FROM orders WHERE amount <= i * 10) AS upto FROM n"),
    ("SELECT region, max(amount) FILTER (WHERE day > '2024-01-01') AS late_max, "
     "string_agg(day, ',' ORDER BY day) AS days FROM orders GROUP BY ALL"),
    "SELECT * FROM orders WHERE region IN (SELECT region FROM regions WHERE name LIKE 'N%')",
    "SELECT * FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND r.name = 'South')",
    "SELECT region FROM orders UNION SELECT region FROM regions EXCEPT SELECT 'x'",
    ("SELECT day, CASE WHEN amount >= 30 THEN 'big' ELSE 'small' END AS size, amount::DOUBLE / 10 AS tens, "
     "CAST(day AS DATE) + INTERVAL 1 DAY AS next_day FROM orders"),
    "SELECT date_trunc('month', CAST(day AS DATE)) AS month, sum(amount) FROM orders GROUP BY 1",
    ("SELECT region, quantile_cont(amount, 0.5) AS median, stddev_samp(amount) AS sd, arg_max(day, amount) AS peak "
     "FROM orders GROUP BY region"),
    "SELECT upper(name), length(name), regexp_replace(name, 'th', 'TH') AS replaced, name || '!' FROM regions",
    ("SELECT o.region, list(o.amount ORDER BY o.amount) AS amounts, "
     "list_transform(list(o.amount), lambda x: x * 2) AS doubled FROM orders o GROUP BY o.region"),
    "SELECT i, o.top FROM range(3) t(i), LATERAL (SELECT max(amount) AS top FROM orders WHERE amount <= (i + 1) * 10) o",
    "SELECT * FROM (VALUES ('n', 1), ('s', 2)) v(region, rank) JOIN regions USING (region)",
    ("SELECT region, amount, rank() OVER w AS rk, percent_rank() OVER w AS pr FROM orders "
     "WINDOW w AS (PARTITION BY region ORDER BY amount)"),
    "SELECT region, sum(amount) AS total FROM orders GROUP BY ROLLUP (region)",
    "SELECT day, amount FROM orders WHERE amount BETWEEN $low AND $high",
    "SELECT DISTINCT ON (region) region, day, amount FROM orders ORDER BY region, amount DESC",
    "SELECT * EXCLUDE (amount), amount * 2 AS doubled FROM orders",
    "SELECT unnest([1, 2, 3]) AS x, generate_series(1, 3) AS s, [i * 2 FOR i IN [1, 2, 3] IF i > 1] AS evens",
    "SELECT count(DISTINCT region), approx_count_distinct(day), bool_and(amount > 0) FROM orders",
    "SELECT struct_pack(d := day, a := amount) AS s, {'r': region} AS t, [amount, amount + 1] AS l FROM orders",
    "FROM orders SELECT region, count(*) GROUP BY region",
    ("SELECT r.name, t.total FROM regions r, (SELECT region, sum(amount) AS total FROM orders GROUP BY region) t "
     "WHERE t.region = r.region"),
    "SELECT current_date IS NOT NULL AS today_known, greatest(1, 2), least(3, 4), round(pi(), 2), abs(-3)",
)
"""Analytic SELECTs the gateway admits; the one with ``$low``/``$high`` binds ``{"low": 15, "high": 35}``."""
