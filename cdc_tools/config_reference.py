"""docs/config.md, generated from the config model: every field's type, default and description.

The pydantic model `cdc_pipeline.config.TableConfig` is the one source of the config reference:
a field's description is written once, in its `Field(description=...)`, and this module turns
the model into the Markdown page. `tests/repo/test_docs.py` regenerates it and fails when the
committed page differs, so a field added or changed without `--write` is caught.

    python -m cdc_tools.config_reference > docs/config.md
    python -m cdc_tools.config_reference --write
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from cdc_pipeline.config import (
    COLUMN_PATTERN,
    DEFAULT_SEQUENCE_BY,
    NAME_PATTERN,
    ColumnList,
    ColumnTypes,
    Duration,
    Schedule,
    TableConfig,
    project_root,
    with_format_defaults,
)

DOC_PATH = Path("docs") / "config.md"

HEADER = """\
# Config reference

<!-- Generated from cdc_pipeline.config.TableConfig by cdc_tools/config_reference.py: do not edit.
     Change a Field(description=...) and run `python -m cdc_tools.config_reference --write`. -->

One YAML file holds the config table: one row per source table. Back to the
[README](../README.md), which has an example row.

## The file

`config/tables.yaml`, or the file in `CDC_CONFIG`, or `--config PATH` of any `cdc` command.

```yaml
defaults:             # optional: any field below, for every row
  schedule: "@hourly"
tables:
  - name: orders      # one row per table; see the fields below
    ...
```

`defaults:` sets any field for every row; a row's own value wins. Unknown fields are errors.
Check it with `.venv/bin/cdc validate`, which prints one line per problem with the file's line,
the table, the field, what is wrong and the fix (`config/tables.yaml:12: table orders: keys:
'IDX' is not a declared column; did you mean `ID`? (declared: ID, TS)`) and exits 2; a bad row
never hides the good ones. It is exactly as strict as what runs: every field and every
cross-field rule of every row in one pass, a key the YAML repeats (`ID: bigint ... ID: string`)
is an error rather than "last wins", schedules are checked with croniter as Airflow's timetable
does, and `partition_expression` against its allow-list (below). Without `columns`, validate
cannot know the data's columns: the first run checks `keys`, `sequence_by` and `zorder_by`
against the change files and fails once (exit 2, nothing written) naming the field and the
columns the files carry.

Adding a row adds a table; nothing else changes.

## Environment

| variable | default | meaning |
|---|---|---|
| `CDC_CONFIG` | `config/tables.yaml` | the config table file (`--config PATH` wins) |
| `CDC_LANDING` | `landing/` | root of the landing folders: `{landing}/{name}/dt=YYYY-MM-DD/hr=HH/` |
| `CDC_WAREHOUSE` | `warehouse/` | root of the Delta tables: `{warehouse}/{name}/final`, `staging`, ... |
| `CDC_MAX_LINE_BYTES` | `16777216` (16 MiB) | the longest line a CSV or JSON change file may hold (at least 1 MiB); a file with a longer line is refused alone (one quarantine row naming the limit), since one such line can take the driver's memory and fail every run of its table. Raise it with `CDC_SPARK_DRIVER_MEMORY` (16 MiB lines read with Spark's default 1g) |

The defaults are under the repository root and git-ignored. The Spark side has its own
(`CDC_SPARK_REMOTE`, `CDC_SPARK_MASTER`, `CDC_SPARK_DRIVER_MEMORY`, `CDC_SPARK_CONNECT_TIMEOUT`):
see [Operations](operations.md).

## Fields

Durations are text: `45s`, `30m`, `2h`, `1h30m`, `1d`. A cadence of `null` means never.
"""

OPERATIONS = "operations.md#operations-timeouts-pools-alerts-assets-manual-runs"
# Where a field is explained at length, beyond its description.
SEE_ALSO: dict[str, list[tuple[str, str]]] = {
    "file_format": [("Change formats", "formats.md#change-formats")],
    "change_format": [
        ("Change formats", "formats.md#change-formats"),
        ("Snapshot extracts", "formats.md#snapshot-extracts"),
    ],
    "compare_exclude": [("Snapshot extracts", "formats.md#snapshot-extracts")],
    "history": [("History", "history.md")],
    "track_history_columns": [("History", "history.md")],
    "history_buckets": [("History", "history.md")],
    "columns": [("Schema evolution", "formats.md#schema-evolution")],
    "on_schema_change": [("Schema evolution", "formats.md#schema-evolution")],
    "sequence_by": [("Semantics", "semantics.md#semantics")],
    "partition_stable": [("Performance", "performance.md#the-benchmark")],
    "spark_conn_id": [
        ("Spark runtime", "operations.md#spark-runtime-connect-or-spark-submit"),
    ],
    **{
        name: [("Operations", OPERATIONS)]
        for name in (
            "execution_timeout",
            "dagrun_timeout",
            "retries",
            "freshness",
            "notify",
            "max_quarantine_fraction",
            "quarantine_action",
        )
    },
}
# The config's reusable validated types, by the words the page uses for them.
NAMED_TYPES: tuple[tuple[Any, str], ...] = (
    (ColumnList, "list of column names"),
    (ColumnTypes, "mapping column -> Spark SQL type"),
)
# The config's value types (text as written, read once into a value), by the page's words.
VALUE_TYPES: dict[Any, str] = {Duration: "duration", Schedule: "cron or preset"}
PATTERN_WORDS = {
    NAME_PATTERN: "lower-case letters, digits and _, starting with a letter",
    COLUMN_PATTERN: "letters, digits and _, not starting with a digit",
}


def describe_type(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    """A field's type in words: `list of column names`, `` `warn` or `fail` ``, `integer 1..4096`."""
    if metadata:
        if get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(
            annotation
        ):
            # `ColumnList | None` with bounds: the bounds belong to the value, not to null.
            (value,) = [arg for arg in get_args(annotation) if arg is not type(None)]
            return f"{describe_type(value, metadata)} or null"
        return describe_type(Annotated[annotation, *metadata])
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extras = get_args(annotation)
        for named, words in NAMED_TYPES:
            named_extras = get_args(named)[1:]
            if named_extras and all(extra in extras for extra in named_extras):
                rest = [extra for extra in extras if extra not in named_extras]
                return _with_constraints(words, rest)
        return _with_constraints(describe_type(base), extras)
    if origin in (Union, types.UnionType):
        parts = [describe_type(arg) for arg in get_args(annotation) if arg is not type(None)]
        nullable = type(None) in get_args(annotation)
        return " or ".join(parts) + (" or null" if nullable else "")
    if origin is Literal:
        return " or ".join(f"`{value}`" for value in get_args(annotation))
    if origin is list:
        return f"list of {describe_type(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping {describe_type(key)} -> {describe_type(value)}"
    plain = {str: "text", bool: "true or false", int: "integer", float: "number", date: "date"}
    return {**plain, **VALUE_TYPES}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _with_constraints(words: str, constraints: Sequence[Any]) -> str:
    """`words` with the bounds, lengths and patterns pydantic keeps as metadata."""
    low = high = None
    notes = []
    for constraint in constraints:
        low = getattr(constraint, "ge", low)
        high = getattr(constraint, "le", high)
        if getattr(constraint, "min_length", None) == 1:
            notes.append("not empty")
        pattern = getattr(constraint, "pattern", None)
        if pattern:
            notes.append(PATTERN_WORDS.get(pattern, f"matching `{pattern}`"))
    if low is not None and high is not None:
        words += f" {low}..{high}"
    elif low is not None:
        words += f", at least {low}"
    elif high is not None:
        words += f", at most {high}"
    return f"{words} ({', '.join(notes)})" if notes else words


def describe_default(name: str, info: FieldInfo) -> str:
    """The default as YAML would write it, with the defaults a change_format implies."""
    implied = _format_defaults(name)
    if info.is_required():
        shown = "required"
    else:
        shown = f"`{_yaml(info.get_default(call_default_factory=True))}`"
    return "; ".join([shown, *implied])


def _format_defaults(name: str) -> list[str]:
    """`json` for debezium and wal2json, and the like: what `with_format_defaults` fills in."""
    by_value: dict[str, list[str]] = {}
    for change_format in DEFAULT_SEQUENCE_BY:
        given = {"change_format": change_format}
        filled = with_format_defaults(given)
        if name in filled and name not in given:
            by_value.setdefault(_yaml(filled[name]), []).append(change_format)
    return [f"`{value}` for {' and '.join(formats)}" for value, formats in by_value.items()]


def _yaml(value: Any) -> str:
    """A default value in the YAML spelling of the config table."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    """Text that stays in one Markdown table cell and shows as written.

    Outside `code` spans and [links](...), `_`, `*` and `<` are escaped: descriptions are plain
    text, where `_cdc_` is a column prefix (not emphasis) and `cdc_<name>` a pattern (not a tag).
    """
    parts = re.split(r"(`[^`]*`|\[[^\]]*\]\([^)]*\))", " ".join(text.split()))
    for index in range(0, len(parts), 2):
        parts[index] = re.sub(r"([_*<])", r"\\\1", parts[index])
    return "".join(parts).replace("|", "\\|")


def render() -> str:
    """The whole config reference page, as Markdown."""
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, info in TableConfig.model_fields.items():
        kind = describe_type(info.annotation, info.metadata)
        description = info.description or ""
        links = ", ".join(f"[{title}]({target})" for title, target in SEE_ALSO.get(name, []))
        if links:
            description += f" See {links}."
        rows.append(
            f"| `{name}` | {_cell(kind)} | {_cell(describe_default(name, info))} "
            f"| {_cell(description)} |"
        )
    return HEADER + "\n" + "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the page, or with --write replace docs/config.md in the repository."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {DOC_PATH} instead of printing it"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.write:
        target = project_root() / DOC_PATH
        target.write_text(page)
        print(f"wrote {target}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
