"""The config's validated value types: each checks one field on its own, in the project's words.

`Duration` and `Schedule` keep the text as written (what `cdc validate`, the DAG docs and the
config reference show, and what `model_dump` gives back) and carry the value it means, parsed
once here: `Duration.delta` is a timedelta, `Schedule.cron` the cron expression.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, GetCoreSchemaHandler
from pydantic_core import core_schema

from cdc_pipeline.columns import TECHNICAL_PREFIX
from cdc_pipeline.config.messages import COLUMN_PATTERN, NAME_PATTERN, PATTERN_HELP
from cdc_pipeline.durations import parse_duration
from cdc_pipeline.schedules import cron_of, schedule_problem
from cdc_pipeline.schema import (
    SPARK_TYPES_HELP,
    is_length_type,
    is_nested_type,
    is_spark_sql_type,
)


class _ParsedText(str):
    """Text that is checked and read once, when pydantic validates it (a str for its users)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # Text first, so a number or a null reads "is not text" like any other text field.
        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.to_string_ser_schema()
        )


class Duration(_ParsedText):
    """A duration as written (`30m`, `2h`, `1h30m`, `1d`), and its value `delta`."""

    delta: timedelta

    def __new__(cls, text: str) -> Duration:
        delta = parse_duration(text)  # ValueError naming the text
        duration = super().__new__(cls, text)
        duration.delta = delta
        return duration


class Schedule(_ParsedText):
    """A cadence as written (a preset such as `@daily`, or a cron), and its cron expression."""

    cron: str

    def __new__(cls, text: str) -> Schedule:
        problem = schedule_problem(text)
        if problem:
            raise ValueError(problem)
        schedule = super().__new__(cls, text)
        schedule.cron = cron_of(text)
        return schedule


def _no_duplicates(value: list[str]) -> list[str]:
    duplicates = sorted({v for v in value if value.count(v) > 1})
    if duplicates:
        raise ValueError(f"lists {', '.join(duplicates)} more than once")
    return value


def _columns_are_typed(value: dict[str, str]) -> dict[str, str]:
    if not value:
        raise ValueError("must name at least one column")
    problems = []
    by_case: dict[str, list[str]] = {}
    for column in value:
        by_case.setdefault(column.lower(), []).append(column)
    for same in by_case.values():
        if len(same) > 1:
            problems.append(
                f"column names {' and '.join(same)} differ only in case (Spark does not tell "
                "them apart)"
            )
    for column, spark_type in value.items():
        if not re.match(COLUMN_PATTERN, column):
            problems.append(f"column name {column!r} {PATTERN_HELP[COLUMN_PATTERN]}")
        elif column.lower().startswith(TECHNICAL_PREFIX):
            problems.append(f"column name {column!r} uses the reserved prefix {TECHNICAL_PREFIX}")
        if isinstance(spark_type, str) and is_nested_type(spark_type):
            # Change rows are flat: a nested value has no key, sequence or quarantine rule here.
            problems.append(
                f"type {spark_type!r} of {column} is nested, and nested types are not supported "
                "(change rows are flat): flatten it into columns at the source"
            )
        elif not isinstance(spark_type, str) or not is_spark_sql_type(spark_type):
            problems.append(f"type {spark_type!r} of {column} is not {SPARK_TYPES_HELP}")
        elif is_length_type(spark_type):
            # Spark stores varchar(n)/char(n) as string: the length would be checked nowhere.
            problems.append(
                f"type {spark_type!r} of {column} declares a length, which is not enforced "
                "(the column would hold longer values): declare string"
            )
    if problems:
        raise ValueError("; ".join(problems))
    return {column: spark_type.strip().lower() for column, spark_type in value.items()}


def _notifier_names(value: list[str]) -> list[str]:
    bad = [name for name in value if not re.match(NAME_PATTERN, str(name))]
    if bad:
        raise ValueError(f"notifier names must match {NAME_PATTERN}: {', '.join(map(str, bad))}")
    return _no_duplicates(value)


def _covers_an_hour(value: Duration) -> Duration:
    if value.delta < timedelta(hours=1):
        raise ValueError(f"{value!r} is shorter than one hour folder: give at least 1h")
    return value


ColumnList = Annotated[list[str], AfterValidator(_no_duplicates)]
ColumnTypes = Annotated[dict[str, str], AfterValidator(_columns_are_typed)]
NotifierNames = Annotated[list[str], AfterValidator(_notifier_names)]
# The landing is listed by hour folders: a shorter window would miss the run's own folder.
LateArrivalWindow = Annotated[Duration, AfterValidator(_covers_an_hour)]
