"""Schema evolution rules: which type changes widen, and what a batch's schema does to a table.

Pure Python over Spark SQL type names (`bigint`, `decimal(12,2)`, ...), so the rules are tested
without Spark. A batch's column types are compared with the table's: a new column is added (older
rows read null), a widening change is applied, a narrowing or incompatible change refuses the
batch. Values narrower than the table's type (an int batch into a bigint column) need no change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

# The Spark SQL type vocabulary, in one place. Flat types in their one spelling (nested types are
# not supported: change rows are flat), then the other spellings of them.
FLAT_TYPES = frozenset(
    {
        "boolean",
        "tinyint",
        "smallint",
        "int",
        "bigint",
        "float",
        "double",
        "string",
        "date",
        "timestamp",
        "timestamp_ntz",
        "binary",
    }
)
# Aliases a config's column types may use.
DECLARABLE_ALIASES = {"byte": "tinyint", "short": "smallint", "integer": "int", "long": "bigint"}
# Every alias normalize_type reads (Spark's own schema strings also print these two).
_ALIASES = {**DECLARABLE_ALIASES, "real": "float", "timestamp_ltz": "timestamp"}
INTEGER_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}
_DECIMAL = re.compile(r"^(?:decimal|numeric)(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$")
_TEXT = re.compile(r"^(?:varchar|char)\(\s*\d+\s*\)$")
# A declared decimal names its precision; a declared varchar/char its length.
_DECLARABLE_PARAM_TYPES = re.compile(
    r"^(decimal|numeric)\(\s*\d+\s*(,\s*\d+\s*)?\)$|^(varchar|char)\(\s*\d+\s*\)$"
)
MAX_DECIMAL_PRECISION = 38
SPARK_TYPES_HELP = (
    "a Spark SQL type such as bigint, int, string, double, decimal(10,2), date, timestamp"
)


def is_spark_sql_type(text: str) -> bool:
    """True when `text` names a flat Spark SQL type this project can cast change values to."""
    normalized = text.strip().lower()
    return (
        normalized in FLAT_TYPES
        or normalized in DECLARABLE_ALIASES
        or bool(_DECLARABLE_PARAM_TYPES.match(normalized))
    )


def is_nested_type(text: str) -> bool:
    """True for `array<...>`, `map<...>` and `struct<...>` (any case, spaces before `<`)."""
    return bool(re.match(r"^\s*(array|map|struct)\s*<", text.lower()))


def is_length_type(text: str) -> bool:
    """True for `varchar(n)` and `char(n)`: Spark reads and writes them as string."""
    return bool(_TEXT.match(text.strip().lower()))


def normalize_type(spark_type: str) -> str:
    """A Spark SQL type name in one spelling: `long` -> `bigint`, `numeric(5)` -> `decimal(5,0)`."""
    text = spark_type.strip().lower()
    text = _ALIASES.get(text, text)
    decimal = _DECIMAL.match(text)
    if decimal:
        precision = int(decimal.group(1) or 10)
        scale = int(decimal.group(2) or 0)
        return f"decimal({precision},{scale})"
    if _TEXT.match(text):
        return "string"
    return text


def _decimal_parts(spark_type: str) -> tuple[int, int] | None:
    """(integer digits, scale) of a decimal or integer type; None for other types."""
    if spark_type in INTEGER_DIGITS:
        return INTEGER_DIGITS[spark_type], 0
    decimal = _DECIMAL.match(spark_type)
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return precision - scale, scale
    return None


def common_type(first: str, second: str) -> str | None:
    """The narrowest type both widen to without loss, or None when there is none.

    Widening follows Delta's type widening: integers to wider integers, float to double,
    tinyint/smallint/int to double, integers and decimals to a decimal with enough integer
    digits and scale (at most 38 digits), date to timestamp.
    """
    a, b = normalize_type(first), normalize_type(second)
    if a == b:
        return a
    if a in INTEGER_DIGITS and b in INTEGER_DIGITS:
        return a if INTEGER_DIGITS[a] >= INTEGER_DIGITS[b] else b
    pair = {a, b}
    if pair == {"float", "double"}:
        return "double"
    if "double" in pair and (pair - {"double"}) <= {"tinyint", "smallint", "int", "float"}:
        return "double"
    if pair == {"date", "timestamp"}:
        return "timestamp"
    parts_a, parts_b = _decimal_parts(a), _decimal_parts(b)
    if parts_a is not None and parts_b is not None:
        digits = max(parts_a[0], parts_b[0])
        scale = max(parts_a[1], parts_b[1])
        if digits + scale > MAX_DECIMAL_PRECISION:
            return None
        return f"decimal({digits + scale},{scale})"
    return None


def accepts(table_type: str, batch_type: str) -> bool:
    """True when the batch's values can be stored in the table's column as it is."""
    table = normalize_type(table_type)
    batch = normalize_type(batch_type)
    if table == "string":
        return True  # any value read from a change file has a text form
    if table == "double" and _decimal_parts(batch) is not None:
        return True  # JSON numbers into a double column
    return common_type(table, batch) == table


@dataclass
class SchemaPlan:
    """What a batch does to a table's columns."""

    columns: dict[str, str]  # the table's data columns after the batch, in table order
    added: dict[str, str] = field(default_factory=dict)
    widened: dict[str, tuple[str, str]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        """True when the table's schema must change."""
        return bool(self.added or self.widened)

    def describe(self) -> str:
        """The changes, one phrase each, for a summary or an error."""
        parts = [f"add {name} {kind}" for name, kind in self.added.items()]
        parts += [f"widen {name} {old} -> {new}" for name, (old, new) in self.widened.items()]
        return ", ".join(parts)


Policy = Literal["evolve", "quarantine"]


def plan_schema(
    table_columns: dict[str, str] | None, batch_columns: dict[str, str | None], policy: Policy
) -> SchemaPlan:
    """Compare a batch's column types with the table's (None: no table yet).

    A batch type of None means the batch holds only nulls for the column: it changes nothing
    (a new all-null column is added once a batch carries a value). Columns the table has and
    the batch lacks stay (their values are null for the batch's rows).
    """
    if table_columns is None:
        known = {name: normalize_type(t) for name, t in batch_columns.items() if t is not None}
        return SchemaPlan(columns=known)
    plan = SchemaPlan(columns={name: normalize_type(t) for name, t in table_columns.items()})
    for name, batch_type in batch_columns.items():
        if batch_type is None:
            continue
        batch_type = normalize_type(batch_type)
        current = plan.columns.get(name)
        if current is None:
            plan.added[name] = batch_type
        elif not accepts(current, batch_type):
            wider = common_type(current, batch_type)
            if wider is None:
                plan.refused.append(
                    f"{name} changes from {current} to {batch_type}, which is not a widening"
                )
            else:
                plan.widened[name] = (current, wider)
    if policy == "quarantine" and plan.changes:
        plan.refused.append(f"on_schema_change is quarantine and the batch would {plan.describe()}")
    if not plan.refused:
        for name, (_, wider) in plan.widened.items():
            plan.columns[name] = wider
        plan.columns.update(plan.added)
    return plan
