"""The second check of `partition_expression`: the functions Spark's analyser resolved.

The config check (`cdc_pipeline.sql_guard`) parses the text with sqlglot; this one asks Spark
what the text means, on the change rows it will be applied to, and checks the resolved function
names against the same allow-list. So a function sqlglot reads differently from Spark cannot
slip through. It uses `EXPLAIN EXTENDED` through `spark.sql` with a DataFrame argument, which
works under a classic session and under Spark Connect alike (no `_jdf`/`_jvm`), runs no Spark
job (an EXPLAIN is a command answered by the driver, over `df.limit(0)`), and is done once per
(table, expression, input columns) in a process.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame

from cdc_pipeline import sql_guard
from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import ConfigError

ANALYSED = "== Analyzed Logical Plan =="
_checked: set[tuple[str, str, tuple[str, ...]]] = set()


def analysed_projection(plan: str) -> str:
    """The top Project line of an EXPLAIN EXTENDED text's analysed plan (the expression as `p`)."""
    if ANALYSED not in plan:
        raise ValueError("EXPLAIN EXTENDED gave no analysed plan")
    analysed = plan.split(ANALYSED, 1)[1].split("== Optimized Logical Plan ==", 1)[0]
    for line in analysed.splitlines():
        if line.strip().startswith("Project ["):
            return line.strip()
    # An expression Spark cannot resolve: EXPLAIN prints the analysis error in the plan's place.
    reason = next((line.strip() for line in analysed.splitlines() if line.strip()), "")
    raise ValueError(reason or "the analysed plan has no projection")


def analysed_function_names(df: DataFrame, expression: str) -> set[str]:
    """Names of the functions Spark resolves `expression` to over the columns of `df`."""
    literals = sql_guard.string_literals(expression)
    # spark.sql formats the text with str.format: braces of the expression are doubled.
    escaped = expression.replace("{", "{{").replace("}", "}}")
    rows = df.sparkSession.sql(
        f"EXPLAIN EXTENDED SELECT {escaped} AS p FROM {{rows}}", rows=df.limit(0)
    ).collect()  # metadata: one row, the plan text
    return sql_guard.function_names_in_plan(analysed_projection(str(rows[0][0])), literals)


def check_partition_expression(
    df: DataFrame, table: TableConfig, columns: Sequence[str] | None = None
) -> None:
    """Refuse the table's partition expression when the parser or the analyser finds a function
    outside the allow-list; a ConfigError names table, field and construct. `columns`: `df`'s,
    when known without asking Spark."""
    expression = table.partition_expression
    if expression is None:
        return
    key = (table.name, expression, tuple(df.columns if columns is None else columns))
    if key in _checked:
        return
    # The parser layer first: the expression is put into SQL text only once it is one
    # expression of allowed constructs.
    problems = sql_guard.expression_problems(expression, None, list(table.format_columns))
    if not problems:
        try:
            names = analysed_function_names(df, expression)
        except ValueError as error:
            raise ConfigError(
                f"table {table.name}: partition_expression: {expression!r} cannot be resolved "
                f"over the change rows: {error}"
            ) from None
        problems = sql_guard.analysed_function_problems(names)
    if problems:
        raise ConfigError(
            f"table {table.name}: partition_expression: {expression!r} refused: "
            + "; ".join(problems[:3])
        )
    _checked.add(key)
