"""The change formats as the config sees them: their `_cdc_` columns and the defaults they imply."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdc_pipeline.columns import (
    BINLOG_FILE,
    BINLOG_POS,
    BINLOG_ROW,
    LSN,
    OP,
    POSITION,
    SNAPSHOT_AT,
    SOURCE_TS_MS,
)

# Columns a change format adds to every change row, usable in sequence_by (name -> Spark type).
FORMAT_COLUMNS: dict[str, dict[str, str]] = {
    "flat": {},
    "debezium": {
        SOURCE_TS_MS: "bigint",
        LSN: "bigint",
        BINLOG_FILE: "string",
        BINLOG_POS: "bigint",
        BINLOG_ROW: "int",
        POSITION: "string",
    },
    "wal2json": {LSN: "bigint", POSITION: "string"},
    "snapshot": {SNAPSHOT_AT: "timestamp"},
}
# The source's own order, used when a row of these formats omits sequence_by.
DEFAULT_SEQUENCE_BY: dict[str, list[str]] = {
    "debezium": [SOURCE_TS_MS, POSITION],
    "wal2json": [POSITION],
    "snapshot": [SNAPSHOT_AT],
}
# Formats whose changes are events read from JSON lines (they carry an op, not a flag column).
EVENT_FORMATS = ("debezium", "wal2json")
# Where the change kind is read from for the event formats (they carry an op, not a flag column).
EVENT_OP_COLUMN = OP


def is_change_format(value: object) -> bool:
    """True for a change_format this project reads (a value of any YAML type may be asked)."""
    return isinstance(value, str) and value in FORMAT_COLUMNS


def with_format_defaults(data: Any) -> Any:
    """A row with the defaults its change format implies (file_format json, the source order)."""
    if isinstance(data, Mapping) and data.get("source") == "kafka":
        data = dict(data)
        data.setdefault("file_format", "json")  # a message's value is one JSON change
    change_format = data.get("change_format") if isinstance(data, Mapping) else None
    if isinstance(change_format, str) and change_format in DEFAULT_SEQUENCE_BY:
        data = dict(data)
        if change_format in EVENT_FORMATS:
            data.setdefault("file_format", "json")
        if not data.get("sequence_by"):
            data["sequence_by"] = list(DEFAULT_SEQUENCE_BY[change_format])
    return data
