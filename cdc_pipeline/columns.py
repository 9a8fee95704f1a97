"""Every `_cdc_` name the project gives a column or a file, in one place.

Data columns never start with `_cdc_` (the config refuses it): these are the project's own.
"""

from __future__ import annotations

TECHNICAL_PREFIX = "_cdc_"

# Where a change came from, in staging, final and quarantine (its arrival): the hour folder, the
# file (a later version of a file as `name~v002`), the row or line in it.
BATCH = "_cdc_batch"
FILE = "_cdc_file"
ROW = "_cdc_row"
ARRIVAL = (BATCH, FILE, ROW)

# Staging: the change's flag (I, U, D, T), and the data columns an insert or update did not carry.
FLAG = "_cdc_flag"
ABSENT = "_cdc_absent"

# Quarantine: why a row cannot be applied, and its raw line or CSV row.
REASON = "_cdc_reason"
RAW = "_cdc_raw"
FORMAT_ERROR = "_cdc_format_error"  # while reading: the line's own problem, if any

# The event formats' columns (cdc_pipeline/config/formats.py FORMAT_COLUMNS): source time, positions, the event's op.
SOURCE_TS_MS = "_cdc_source_ts_ms"
LSN = "_cdc_lsn"
BINLOG_FILE = "_cdc_binlog_file"
BINLOG_POS = "_cdc_binlog_pos"
BINLOG_ROW = "_cdc_binlog_row"
POSITION = "_cdc_position"
OP = "_cdc_op"

# Snapshot extracts: when the extract was taken, the key's and the row's hashes.
SNAPSHOT_AT = "_cdc_snapshot_at"
KEY_HASH = "_cdc_key_hash"
ROW_HASH = "_cdc_row_hash"

# History (SCD type 2).
BUCKET = "_cdc_key_bucket"
VALID_FROM = "_cdc_valid_from"
VALID_TO = "_cdc_valid_to"
IS_CURRENT = "_cdc_is_current"
IS_DELETED = "_cdc_is_deleted"

# Working columns of one step, never stored.
RANK = "_cdc_rank"

# Files next to a table's Delta tables.
CHECK_FILE = "_cdc_check.json"  # written by `cdc check`, read by the CDC tables view


def quoted(column: str) -> str:
    """`column` as one Spark SQL identifier (`F.col`, `selectExpr`), whatever it holds (dots,
    backticks)."""
    return "`" + column.replace("`", "``") + "`"


def string_literal(text: str) -> str | None:
    """`text` as a Spark SQL string literal; None when it holds a quote or a backslash (how
    Spark reads their escapes depends on `spark.sql.parser.escapedStringLiterals`)."""
    if "'" in text or "\\" in text:
        return None
    return f"'{text}'"
