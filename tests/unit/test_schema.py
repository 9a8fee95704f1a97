"""Schema evolution rules (pure): widening, refusal, and what a batch does to a table."""

from __future__ import annotations

import pytest

from cdc_pipeline.schema import accepts, common_type, normalize_type, plan_schema
from spark_jobs.formats.debezium import connect_type
from spark_jobs.formats.json_lines import variant_type
from spark_jobs.formats.wal2json import postgres_type


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("int", "bigint", "bigint"),
        ("integer", "long", "bigint"),
        ("smallint", "tinyint", "smallint"),
        ("float", "double", "double"),
        ("int", "double", "double"),
        ("bigint", "double", None),  # beyond 2**53 a double loses digits
        ("decimal(10,2)", "decimal(12,2)", "decimal(12,2)"),
        ("decimal(10,2)", "decimal(10,4)", "decimal(12,4)"),
        ("int", "decimal(5,2)", "decimal(12,2)"),
        ("bigint", "decimal(38,20)", None),
        ("date", "timestamp", "timestamp"),
        ("bigint", "string", None),
        ("boolean", "int", None),
    ],
)
def test_common_type(first: str, second: str, expected: str | None) -> None:
    assert common_type(first, second) == expected
    assert common_type(second, first) == expected


def test_normalize_and_accepts() -> None:
    assert normalize_type("NUMERIC(5)") == "decimal(5,0)"
    assert normalize_type("varchar(20)") == "string"
    assert accepts("bigint", "int")
    assert accepts("string", "bigint")
    assert accepts("double", "decimal(5,2)")
    assert not accepts("int", "bigint")
    assert not accepts("bigint", "string")


def test_plan_adds_widens_and_keeps_missing_columns() -> None:
    plan = plan_schema(
        {"ID": "bigint", "V": "int", "OLD": "string"},
        {"ID": "int", "V": "bigint", "NEW": "string", "EMPTY": None},
        "evolve",
    )
    assert plan.refused == []
    assert plan.added == {"NEW": "string"}
    assert plan.widened == {"V": ("int", "bigint")}
    assert plan.columns == {"ID": "bigint", "V": "bigint", "OLD": "string", "NEW": "string"}
    assert plan.describe() == "add NEW string, widen V int -> bigint"


def test_plan_refuses_narrowing_and_any_change_under_the_quarantine_policy() -> None:
    plan = plan_schema({"V": "bigint"}, {"V": "string"}, "evolve")
    assert plan.refused == ["V changes from bigint to string, which is not a widening"]
    assert plan.columns == {"V": "bigint"}
    strict = plan_schema({"V": "int"}, {"V": "bigint", "W": "int"}, "quarantine")
    assert strict.refused == [
        "on_schema_change is quarantine and the batch would add W int, widen V int -> bigint"
    ]
    assert plan_schema({"V": "int"}, {"V": "int"}, "quarantine").refused == []
    assert plan_schema(None, {"V": "int", "N": None}, "quarantine").columns == {"V": "int"}


def test_source_type_names() -> None:
    assert postgres_type("numeric(12,2)") == "decimal(12,2)"
    assert postgres_type("character varying(20)") == "string"
    assert postgres_type("timestamp(6) without time zone") == "timestamp"
    assert postgres_type("integer") == "int"
    assert postgres_type("tsvector") == "string"
    assert connect_type("int64/io.debezium.time.MicroTimestamp") == "timestamp"
    assert connect_type("int32/io.debezium.time.Date") == "date"
    assert connect_type("int16") == "smallint"
    assert variant_type("DECIMAL(5,1)") == "double"
    assert variant_type("OBJECT<a: BIGINT>") == "string"
    assert variant_type("VOID") is None
    assert variant_type("BIGINT") == "bigint"
