"""partition_expression is data, not code: the allow-list, on the parsed text and on plan text."""

from __future__ import annotations

import pytest

from cdc_pipeline.sql_guard import (
    analysed_function_problems,
    expression_problems,
    function_names_in_plan,
)

COLUMNS = ["ID", "CREATE_DATE", "TS", "NAME"]
REFLECT = "calls Java methods by reflection"
NONDET = "is nondeterministic (a key's partition must not depend on when or where it runs)"
UNKNOWN = "is not an allowed function (only deterministic scalar functions: date/time, string, math, hash, cast, conditional)"
SUBQUERY = "a subquery or table/file read is not allowed (only columns of the change row)"

GOOD = [
    "year(to_date(CREATE_DATE, 'MM/dd/yyyy'))",
    "to_date(TS)",
    "xxhash64(ID) % 16",
    "pmod(hash(ID), 8)",
    "md5(cast(ID as string))",
    "sha2(NAME, 256)",
    "CASE WHEN ID > 1 THEN 'a' ELSE 'b' END",
    "if(ID > 1, 1, 0)",
    "coalesce(NAME, 'none')",
    "nvl(ID, 0)",
    "try_cast(NAME as int)",
    "date_format(TS, 'yyyy-MM')",
    "date_trunc('HOUR', TS)",
    "substr(upper(NAME), 1, 2)",
    "year(TS) * 100 + month(TS)",
    "floor(ID / 100)",
    "split(NAME, ',')[0]",
    "NAME RLIKE 'a(b)'",
    "lower(name)",  # Spark resolves names case-insensitively
    "`ID` div 2",
    "DATE'2024-01-01'",
]
EVIL = [
    ("java_method('java.lang.System','load','/path/lib.so')", [f"java_method() {REFLECT}"]),
    ("reflect('java.lang.System','getenv','HOME')", [f"reflect() {REFLECT}"]),
    ("concat('x', java_method('java.lang.System','getenv','HOME'))", [f"java_method() {REFLECT}"]),
    ("try_reflect('java.lang.System','getenv','HOME')", [f"try_reflect() {REFLECT}"]),
    (
        "(SELECT first(value) FROM text.`/etc/hostname`)",
        [
            SUBQUERY,
            "aggregate function first() is not allowed (the value must come from the row alone)",
            "'value' is not a declared column",
        ],
    ),
    ("ID IN (SELECT 1)", [SUBQUERY]),
    ("rand()", [f"rand() {NONDET}"]),
    ("randn(1)", [f"randn() {NONDET}"]),
    ("uuid()", [f"uuid() {NONDET}"]),
    ("current_timestamp()", [f"current_timestamp() {NONDET}"]),
    ("now()", [f"now() {NONDET}"]),
    ("current_date", [f"current_date() {NONDET}"]),
    ("monotonically_increasing_id()", [f"monotonically_increasing_id() {NONDET}"]),
    ("spark_partition_id()", [f"spark_partition_id() {NONDET}"]),
    ("input_file_name()", [f"input_file_name() {NONDET}"]),
    ("myudf(ID)", [f"myudf() {UNKNOWN}"]),
    ("read_files('/etc')", [f"read_files() {UNKNOWN}"]),
    ("explode(split(NAME, ','))", [f"explode() {UNKNOWN}"]),
    ("*", ["`*` is not allowed (name the columns)"]),
    (
        "count(*)",
        [
            "aggregate function count() is not allowed (the value must come from the row alone)",
            "`*` is not allowed (name the columns)",
        ],
    ),
    (
        "transform(split(NAME, ','), x -> upper(x))",
        [f"transform() {UNKNOWN}", "a lambda (x -> ...) is not allowed"],
    ),
    ("ID; DROP TABLE x", ["'ID; DROP TABLE x' must be one expression, not 2 statements"]),
    (
        "ID AS p FROM x",
        [
            "'ID AS p FROM x' cannot be parsed as a Spark SQL expression (Invalid expression / "
            "Unexpected token. Line 1, Col: 12.)"
        ],
    ),
    (
        "year(",
        ["'year(' cannot be parsed as a Spark SQL expression (Expecting ). Line 1, Col: 5.)"],
    ),
    ("a.b", ["'a.b': qualified names are not allowed (name a column of the row)"]),
    ("IDX + 1", ["'IDX' is not a declared column"]),
    ("_cdc_lsn", ["'_cdc_lsn' is not a column of the change format (those are: _cdc_position)"]),
    ("   ", ["must not be empty"]),
]


@pytest.mark.parametrize("expression", GOOD)
def test_allowed_expressions_pass(expression: str) -> None:
    assert expression_problems(expression, COLUMNS, ["_cdc_position"]) == []


@pytest.mark.parametrize(("expression", "expected"), EVIL, ids=[e for e, _ in EVIL])
def test_refused_expressions_name_the_construct(expression: str, expected: list[str]) -> None:
    assert expression_problems(expression, COLUMNS, ["_cdc_position"]) == expected


def test_without_declared_columns_only_cdc_references_are_checked() -> None:
    assert expression_problems("year(ANYTHING)", None, []) == []
    assert expression_problems("_cdc_x", None, []) == [
        "'_cdc_x' is not a column of the change format (those are: none)"
    ]


# Analysed projections as Spark 4.2 prints them (EXPLAIN EXTENDED, captured on this machine).
PLANS = [
    (
        "Project [year(to_date(CREATE_DATE#1, Some(MM/dd/yyyy), Some(UTC), true)) AS p#5]",
        (),
        {"year", "to_date"},
    ),
    ("Project [(xxhash64(ID#0L, 42) % cast(16 as bigint)) AS p#15L]", (), {"xxhash64", "cast"}),
    ("Project [if ((ID#0L > cast(1 as bigint))) 1 else 0 AS p#35]", (), {"if", "cast"}),
    ("Project [concat_ws(-, NAME#3, rand() AS p#70]", ["rand("], {"concat_ws"}),
    ("Project [regexp_extract(NAME#3, a(b), 1) AS p#130]", ["a(b)"], {"regexp_extract"}),
    (
        "Project [java_method(java.lang.System, getenv, HOME, true) AS p#135]",
        (),
        {"java_method"},
    ),
    ("Project [rand(1186678369929030008) AS p#145]", (), {"rand"}),
    ("Project [uuid(Some(-4066434614141801965)) AS p#155]", (), {"uuid"}),
    ("Project [SPARK_PARTITION_ID() AS p#165]", (), {"spark_partition_id"}),
]


@pytest.mark.parametrize(("line", "literals", "names"), PLANS)
def test_function_names_are_read_from_an_analysed_plan(
    line: str, literals: list[str], names: set[str]
) -> None:
    assert function_names_in_plan(line, literals) == names


def test_the_analysed_layer_uses_the_same_list() -> None:
    # Drift: had the parser read an allowed name for what Spark resolves to java_method or
    # rand, the names the analyser reports are still refused.
    assert analysed_function_problems({"year", "to_date", "cast"}) == []
    assert analysed_function_problems({"year", "java_method", "rand"}) == [
        f"java_method() {REFLECT}",
        f"rand() {NONDET}",
    ]
