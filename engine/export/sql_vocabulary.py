"""The words gateway SQL may use: the allow-lists :mod:`engine.export.sql_shape` checks a parse tree against.

A statement reaching the gateway's engine may call only the functions named here, cast only to the
types named here and use only the expression and operator kinds :mod:`engine.export.sql_shape`
knows. Each list is an allow-list (decision "iceberg-audience"; CONVENTIONS "a sandbox decides on
the whole parse tree with an allow-list"): a function DuckDB has but this module does not name is
refused, whatever it does, so a new DuckDB release adds nothing a reader can call. Left out on
purpose: everything reading files, the catalog, settings, variables, secrets, the environment or
extensions (``read_*``, ``glob``, ``duckdb_*``, ``pragma_*``, ``current_setting``, ``getenv``,
``getvariable``, ``pg_*``, ``has_*_privilege``, ``version``, ``current_query``, ...), functions that
call another function by a name given as a value (``list_aggregate``, ``invoke``), functions that
change state or wait (``setseed``, ``nextval``, ``sleep_ms``, ``write_log``) and the serializer
(``json_serialize_sql``, ``json_serialize_plan``), which parses and binds SQL of its own.

Names are compared in ASCII lower case, as DuckDB's catalog does; a name with any other character
is refused before it is looked up.
"""

from __future__ import annotations


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


AGGREGATES = _words("""
any_value approx_count_distinct approx_quantile approx_top_k arbitrary arg_max arg_max_null arg_min
arg_min_null argmax argmin array_agg avg bit_and bit_or bit_xor bitstring_agg bool_and bool_or corr
count count_if count_star countif covar_pop covar_samp entropy favg first fsum geomean geometric_mean
group_concat histogram histogram_exact json_group_array json_group_object kahan_sum kurtosis kurtosis_pop
last list listagg mad max max_by mean median min min_by mode product quantile quantile_cont quantile_disc
regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy
reservoir_quantile sem skewness stddev stddev_pop stddev_samp string_agg sum sumkahan var_pop var_samp
variance wavg weighted_avg
""")
"""Aggregate functions (also usable with OVER)."""

WINDOW_FUNCTIONS = _words("""
cume_dist dense_rank first_value lag last_value lead nth_value ntile percent_rank rank rank_dense row_number
""")
"""Functions that exist only with OVER."""

SCALARS = _words("""
abs acos acosh add ago age apply array_append array_apply array_cat array_concat array_contains array_cosine_distance
array_cosine_similarity array_cross_product array_distance array_distinct array_dot_product array_extract
array_filter array_grade_up array_has array_has_all array_has_any array_indexof array_inner_product
array_intersect array_length array_negative_dot_product array_negative_inner_product array_pop_back
array_pop_front array_position array_prepend array_push_back array_push_front array_reduce array_resize
array_reverse array_reverse_sort array_select array_slice array_sort array_to_json array_to_string
array_transform array_unique array_value array_where array_zip ascii asin asinh atan atan2 atanh bar base64
bin bit_count bit_length bit_position bitstring cardinality cbrt ceil ceiling century char_length
character_length chr concat concat_ws contains cos cosh cot current_date current_localtime
current_localtimestamp damerau_levenshtein date_add date_diff date_part date_sub date_trunc datediff
datepart datesub datetrunc day dayname dayofmonth dayofweek dayofyear days_in_month decade decode degrees
divide editdist3 element_at encode ends_with enum_code enum_first enum_last enum_range enum_range_boundary
epoch epoch_ms epoch_ns epoch_us equi_width_bins era even exp factorial fdiv filter flatten floor fmod
format format_bytes formatreadabledecimalsize formatreadablesize from_base64 from_binary from_hex from_json
from_json_strict gamma gcd gen_random_uuid generate_series generate_subscripts get_bit get_current_time
get_current_timestamp grade_up greatest greatest_common_divisor hamming hash hex hour if ilike_escape instr
isfinite isinf isnan isodow isoyear jaccard jaro_similarity jaro_winkler_similarity json json_array
json_array_length json_contains json_exists json_extract json_extract_path json_extract_path_text
json_extract_string json_keys json_merge_patch json_object json_pretty json_quote json_structure
json_transform json_transform_strict json_type json_valid json_value julian last_day lcase lcm least
least_common_multiple left left_grapheme len length length_grapheme levenshtein lgamma like_escape
list_any_value list_append list_apply list_approx_count_distinct list_avg list_bit_and list_bit_or list_bit_xor
list_bool_and list_bool_or list_cat list_concat list_contains list_cosine_distance list_cosine_similarity
list_count list_distance list_distinct list_dot_product list_element list_entropy list_extract list_filter
list_first list_grade_up list_has list_has_all list_has_any list_histogram list_indexof list_inner_product
list_intersect list_kurtosis list_kurtosis_pop list_last list_mad list_max list_median list_min list_mode
list_negative_dot_product list_negative_inner_product list_pack list_position list_prepend list_product
list_reduce list_resize list_reverse list_reverse_sort list_select list_sem list_skewness list_slice
list_sort list_stddev_pop list_stddev_samp list_string_agg list_sum list_transform list_unique list_value
list_var_pop list_var_samp list_where list_zip ln log log10 log2 lower lpad ltrim make_date make_time
make_timestamp make_timestamp_ms make_timestamp_ns make_timestamptz map map_concat map_contains
map_contains_entry map_contains_value map_entries map_extract map_extract_value map_from_entries map_keys
map_values md5 md5_number md5_number_lower md5_number_upper microsecond millennium millisecond minute
mismatches mod month monthname multiply nanosecond nextafter nfc_normalize normalized_interval
not_ilike_escape not_like_escape now nullif octet_length ord parse_formatted_bytes pi position pow power
prefix printf quarter radians random range reduce regexp_escape regexp_extract regexp_extract_all
regexp_full_match regexp_matches regexp_replace regexp_split_to_array repeat replace reverse right
right_grapheme round round_even roundbankers row row_to_json rpad rtrim second set_bit sha1 sha256 sign
signbit sin sinh split split_part sqrt starts_with str_split str_split_regex strftime string_split
string_split_regex string_to_array strip_accents strlen strpos strptime struct_concat struct_contains
struct_extract struct_extract_at struct_has struct_indexof struct_insert struct_keys struct_pack
struct_position struct_update struct_values substr substring substring_grapheme subtract suffix tan tanh
time_bucket timezone timezone_hour timezone_minute to_base to_base64 to_binary to_centuries to_days
to_decades to_hex to_hours to_json to_microseconds to_millennia to_milliseconds to_minutes to_months
to_quarters to_seconds to_timestamp to_weeks to_years today transaction_timestamp translate trim trunc
try_strptime typeof ucase unbin unhex unicode union_extract unnest union_tag union_value upper url_decode
url_encode uuid uuid_extract_timestamp uuid_extract_version uuidv4 uuidv7 week weekday weekofyear xor year
yearweek
""")
"""Scalar functions over values: math, text, dates and times, lists, maps, structs, JSON text."""

OPERATORS = _words("""
+ - * / // % ** ^ & | << >> ~ || ~~ !~~ ~~* !~~* ~~~ !~~~ ->> -> @> <@ && ^@ @ !__postfix
""")
"""Operators, which DuckDB's parse tree spells as functions (``~~`` is LIKE, ``~~~`` GLOB over text)."""

FUNCTIONS = AGGREGATES | WINDOW_FUNCTIONS | SCALARS | OPERATORS
"""Every name a FUNCTION or WINDOW node of gateway SQL may call."""

TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
"""Table functions that read no file and no catalog; SQL calling any other in FROM is refused."""

SQL_VALUE_COLUMNS = frozenset({"current_date", "current_time", "current_timestamp", "localtime", "localtimestamp"})
"""Bare column names DuckDB binds to a function when no column has that name, and that may be read.

The others it binds that way (``user``, ``current_user``, ``session_user``, ``current_role``,
``current_schema``, ``current_catalog``) answer facts about the engine; a column so named is read
qualified (``t.user``)."""

SQL_VALUE_FUNCTIONS = frozenset({"user", "current_user", "session_user", "current_role", "current_schema",
                                 "current_catalog"}) | SQL_VALUE_COLUMNS
"""Every bare column name DuckDB may bind to a function (its ``GetSQLValueFunction``)."""

TYPES = _words("""
bigint binary bit bitstring blob bool boolean bpchar bytea char date datetime dec decimal double float
float4 float8 hugeint int int1 int16 int2 int4 int8 int64 int32 integer interval json list long map
numeric real short signed smallint string struct text time timestamp timestamp_ms timestamp_ns
timestamp_s timestamp_us timestamptz tinyint ubigint uhugeint uint16 uint32 uint64 uint8 uinteger union
usmallint utinyint uuid varbinary varchar array enum
""") | {"timestamp with time zone", "time with time zone", "timetz"}
"""Types a CAST may name (no catalog or schema; a user type would be someone's catalog)."""
