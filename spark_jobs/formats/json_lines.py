"""What every JSON event format shares: the parsed line's columns, the change rows a line
becomes, the checks that quarantine a malformed line, and reading a field of any shape with
`try_variant_get` (null when it has another shape)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.schema import normalize_type

KIND = "__kind"

CHANGES = "__changes"

OP = "__op"

IMAGE = "__image"

TYPES = "__types"

LINE = "value"

# A line's parse, structure and strict check: columns of their own, each computed once a line
# (an expression used several times is computed once only in a projection of its own).
PARSED = "__parsed"

STRUCTURE = "__structure"

STRICT = "__strict"

NOT_UTF8 = "malformed line: not valid UTF-8 text (its bytes that are not are U+FFFD in _cdc_raw)"


@dataclass
class ChangeRead:
    """Change rows as read: string values per column, the op, format columns, arrival."""

    frame: DataFrame
    batch_types: dict[str, str | None]  # column -> type the files give (None: only nulls)
    ignored: dict[str, int] = field(default_factory=dict)
    undeclared: list[str] = field(default_factory=list)
    # The rows carry their keys outside the declared columns (`UNDECLARED`): `undeclared` is
    # known once a pass over the rows has gathered them.
    carries_undeclared: bool = False
    cached: DataFrame | None = None  # the parsed lines, held while the batch is processed
    # The frame's columns when the reader knows them without asking Spark (a request that
    # analyses the read's plan), else None.
    columns: list[str] | None = None

    def release(self) -> None:
        """Drop the cached parse once the step is done with the rows."""
        if self.cached is not None:
            self.cached.unpersist()


def variant_type(description: str | None) -> str | None:
    """Spark SQL type for the values of a column from `schema_of_variant_agg` (None: all null)."""
    if description is None or description.upper() == "VOID":
        return None
    upper = description.upper()
    if upper.startswith(("OBJECT", "ARRAY", "VARIANT")):
        return "string"  # nested values are kept as JSON text
    if upper.startswith("DECIMAL"):
        return "double"  # JSON numbers with a fraction, as Spark's JSON reader infers them
    return normalize_type(description)


def _key_text(image: Column, keys: Sequence[str]) -> Column:
    """The key of an image as one comparable text (null when the image has no key at all)."""
    parts = [F.variant_get(image[k], "$", "string") for k in keys]
    present = reduce(lambda a, b: a | b, [p.isNotNull() for p in parts])
    return F.when(present, F.to_json(F.array(*parts)))


def update_changes(
    old_image: Column, old_types: Column, new_image: Column, new_types: Column, keys: Sequence[str]
) -> Column:
    """An update's changes: a U of the new image, preceded by a D of the old key when it differs."""
    old_key, new_key = _key_text(old_image, keys), _key_text(new_image, keys)
    key_changed = old_image.isNotNull() & old_key.isNotNull() & (old_key != new_key)
    return F.when(
        key_changed,
        F.array(change_struct("D", old_image, old_types), change_struct("U", new_image, new_types)),
    ).otherwise(F.array(change_struct("U", new_image, new_types)))


# Spark's JSON parser (Jackson) refuses nesting deeper than this, even in a field the config
# ignores: such a line is quarantined, saying so rather than "not JSON".
MAX_JSON_DEPTH = 1000

TOO_DEEP = f"malformed line: nested deeper than {MAX_JSON_DEPTH} levels (Spark's JSON parser limit)"


def too_deep(v: Column) -> Column:
    """True for an unparsed line that opens more than MAX_JSON_DEPTH arrays or objects."""
    opened = F.length(F.regexp_replace(F.col(LINE), r"[^\[{]", ""))
    return v.isNull() & (opened > MAX_JSON_DEPTH)


def line_error(v: Column, is_object: Column) -> Column:
    """The reason a line is not a JSON object (start of a format's error chain)."""
    return (
        F.when(too_deep(v), F.lit(TOO_DEEP))
        .when(v.isNull(), F.lit("malformed line: not JSON"))
        .when(~is_object, F.lit("malformed line: not a JSON object"))
    )


# A line's structure: escapes removed, then every string emptied, so brackets and values show.
NO_ESCAPES = r"\\."

STRINGS = r'"[^"]*"'

# A closing bracket followed by anything a JSON value never has there: a second value, text.
AFTER_CLOSE = r"[}\]]\s*[^,}\]\s]"

NON_NUMBER = r"(?<![\w.])[+-]?(NaN|Infinity|INF)(?!\w)"

LONE_SURROGATE = (
    r"(?i)\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})"
    r"|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)

TRAILING = "malformed line: text after its JSON value (one JSON value per line)"

NAN_LITERAL = "malformed line: NaN or Infinity, which is not a JSON number (send null or text)"

SURROGATE = "malformed line: a \\u escape is a lone UTF-16 surrogate, not a character"

DUPLICATE = "malformed line: a field is named more than once in one object"


def structure(line: Column) -> Column:
    """A line's structure (`NO_ESCAPES`, `STRINGS`): `strict_reason`'s input, computed once."""
    return F.regexp_replace(F.regexp_replace(line, NO_ESCAPES, ""), STRINGS, '""')


def strict_reason(v: Column, line_structure: Column) -> Column:
    """Why a line is not exactly one JSON value, beyond Spark's parse (null when it is): Spark
    reads the first value of `{..}{..}` and drops the rest; an unparsed line says what in it is
    not JSON (a NaN literal, a lone surrogate, a repeated field) rather than "not JSON".

    `v` and `line_structure` (`structure`) are columns of the lines' frame, each computed once
    a line: the checks refer to them several times."""
    line = F.col(LINE)

    def without(bracket: str) -> Column:  # two brackets balance when removing either leaves as much
        return F.length(F.replace(line_structure, F.lit(bracket), F.lit("")))

    unbalanced = (without("{") != without("}")) | (without("[") != without("]"))
    keys = F.expr(f"json_object_keys({LINE})")
    return (
        F.when(v.isNotNull() & (line_structure.rlike(AFTER_CLOSE) | unbalanced), F.lit(TRAILING))
        .when(v.isNotNull() | too_deep(v), F.lit(None))
        .when(line.rlike(LONE_SURROGATE), F.lit(SURROGATE))
        .when(line_structure.rlike(NON_NUMBER), F.lit(NAN_LITERAL))
        .when(F.size(keys) != F.size(F.array_distinct(keys)), F.lit(DUPLICATE))
    )


def change_struct(op: str | Column, image: Column, types: Column) -> Column:
    return F.struct(
        (F.lit(op) if isinstance(op, str) else op).alias(OP),
        image.alias(IMAGE),
        types.alias(TYPES),
    )


IMAGE_TYPE = "map<string,variant>"


def no_changes() -> Column:
    return F.array().cast(
        f"array<struct<{OP}:string,{IMAGE}:{IMAGE_TYPE},{TYPES}:map<string,string>>>"
    )


def truncate_change() -> Column:
    """A truncate: no image; it removes every row whose change is ordered before it."""
    return change_struct(
        "T", F.create_map().cast(IMAGE_TYPE), F.lit(None).cast("map<string,string>")
    )


def without_placeholder(image: Column, placeholder: str) -> Column:
    """An image without the values Debezium could not read (its `unavailable.value.placeholder`:
    an unchanged TOASTed value), so they count as not carried; as text, as the base64 of a
    bytea column, or as the only element of an array."""
    texts = [placeholder, base64.b64encode(placeholder.encode()).decode()]
    return F.map_filter(
        image,
        lambda _, v: (
            ~F.coalesce(
                F.variant_get(v, "$", "string").isin(*texts)
                | (F.to_json(v) == json.dumps([placeholder])),
                F.lit(False),
            )
        ),
    )


def image_at(variant: Column, path: str) -> Column:
    """The object at `path` as name -> value; null when absent or not an object (never fails)."""
    return F.try_variant_get(variant, path, "map<string,variant>")


def present_at(variant: Column, path: str) -> Column:
    """True when `path` holds a value other than JSON null."""
    value = F.variant_get(variant, path, "variant")
    return F.coalesce(value.isNotNull() & ~F.is_variant_null(value), F.lit(False))


def not_object(variant: Column, path: str) -> Column:
    """True when `path` holds a value that is not a JSON object (absent or null: False)."""
    value = F.variant_get(variant, path, "variant")
    return present_at(variant, path) & ~F.schema_of_variant(value).startswith("OBJECT")


def wrong_type(variant: Column, path: str, spark_type: str) -> Column:
    """True when `path` holds a value that cannot be read as `spark_type` (1e30 as a bigint)."""
    return present_at(variant, path) & F.try_variant_get(variant, path, spark_type).isNull()


def text_at(variant: Column, path: str) -> Column:
    """The JSON string at `path`; null when absent or another kind of value (an object op)."""
    value = F.variant_get(variant, path, "variant")
    return F.when(F.schema_of_variant(value) == "STRING", F.variant_get(value, "$", "string"))


def named_map(entries: Column) -> Column:
    """map_from_entries of (`k`, `v`) structs, null when a name is null or repeated: Spark fails
    the whole job on either (NULL_MAP_KEY, DUPLICATED_MAP_KEY), so they must never reach it."""
    names = F.transform(entries, lambda e: e["k"])
    valid = ~F.exists(names, lambda n: n.isNull()) & (
        F.size(F.array_distinct(names)) == F.size(names)
    )
    return F.when(valid, F.map_from_entries(entries))


def classified(kind_cases: list[tuple[Column, str]], default: str) -> Column:
    result = F.lit(default)
    for condition, kind in reversed(kind_cases):
        result = F.when(condition, F.lit(kind)).otherwise(result)
    return result
