"""The analysed layer of the partition_expression check, on a real Spark session."""

from __future__ import annotations

import pytest

from cdc_pipeline import sql_guard
from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import ConfigError
from spark_jobs.rules import expression_check

pytestmark = pytest.mark.spark

ROW = {
    "name": "t",
    "columns": {"ID": "bigint", "NAME": "string", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_column": "P",
}


def test_analysed_layer_reads_the_functions_spark_resolves_and_refuses_drift(
    spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = spark.createDataFrame([], "ID bigint, NAME string, TS timestamp")
    assert expression_check.analysed_function_names(
        rows, "year(to_date(NAME, 'MM/dd/yyyy')) * 100 + pmod(xxhash64(ID), 4)"
    ) == {"year", "to_date", "pmod", "xxhash64", "cast"}  # cast: the analyser widens 4
    # A literal holding a parenthesis is not taken for a call (the plan prints it unquoted).
    assert expression_check.analysed_function_names(rows, "concat_ws('-', NAME, 'rand(')") == {
        "concat_ws"
    }
    assert expression_check.analysed_function_names(
        rows, "java_method('java.lang.System', 'getenv', 'HOME')"
    ) == {"java_method"}
    good = TableConfig.model_validate({**ROW, "partition_expression": "date_format(TS, 'yyyy')"})
    expression_check.check_partition_expression(rows, good)  # allowed: no error
    # Drift: a parser that let reflection through is caught by the analysed layer.
    monkeypatch.setattr(sql_guard, "expression_problems", lambda *args, **kwargs: [])
    evil = TableConfig.model_construct(
        **{
            **good.model_dump(),
            "partition_expression": "upper(reflect('java.lang.System', 'getenv', 'HOME'))",
        }
    )
    with pytest.raises(ConfigError) as raised:
        expression_check.check_partition_expression(rows, evil)
    assert str(raised.value) == (
        "table t: partition_expression: \"upper(reflect('java.lang.System', 'getenv', 'HOME'))\" "
        "refused: reflect() calls Java methods by reflection"
    )
