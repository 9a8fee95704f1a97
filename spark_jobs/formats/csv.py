"""CSV change files read line by line: values matched to each file's header by name, bad rows kept.

Spark's CSV reader decodes bytes that are not UTF-8 into U+FFFD without a word, drops the
fields of a row longer than the header and fills a shorter one with nulls, so a header missing
a column shifts nothing but a row with a stray comma loses data silently. Here every file is
read as text lines (Spark keeps their bytes as they are) and each line is parsed with
`from_csv` against its file's header (Spark's own CSV parser, so quoting works as before), with
a corrupt-record column that catches a row whose field count differs from the header. A row
that is not valid UTF-8 or does not fit the header goes to quarantine with the line in
`_cdc_raw` and the reason; a header without a declared column gives that column's values as
null, says so in a warning, and quarantines the file's rows only when the column is one every
row needs (a key, a sequence_by column, the flag). Line breaks inside quoted values are not
supported (as with Spark's CSV reader without multiLine): each part becomes a quarantined row.

The dialect is RFC 4180's: a comma between fields, double quotes around a field that holds one,
a doubled double quote inside a quoted field for one double quote, a backslash an ordinary
character. A file's last row without a line end may be cut mid-write: it is quarantined, and
the completed file, a new version of it, is read whole by a later run.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cdc_pipeline.config import COLUMN_PATTERN, TableConfig
from cdc_pipeline.errors import InputError
from cdc_pipeline.paths import Location
from spark_jobs.formats.json_lines import ChangeRead
from spark_jobs.landing import spark_path
from spark_jobs.rules.transforms import ARRIVAL, BATCH, FILE, FORMAT_ERROR, RAW, ROW
from spark_jobs.runtime.notices import warn
from spark_jobs.runtime.storage import store_for

# A header line longer than this is not read on the driver (its rows are quarantined).
HEADER_LIMIT = 1 << 20
CORRUPT = "__corrupt"
LINE = "value"
NOT_UTF8 = "row is not valid UTF-8 text (its bytes that are not are U+FFFD in _cdc_raw)"
# How much of a file's end is read on the driver to know whether its last row has a line end.
TAIL_BYTES = 4096
CUT = "__cut"
UNTERMINATED = (
    "the file's last row has no line end: it may be cut mid-write, so it is not applied; the "
    "completed file (its last row ending in a line end) is read whole as a new version"
)
# RFC 4180: a doubled quote inside a quoted field is one quote; a backslash is a character.
DIALECT = {"sep": ",", "quote": '"', "escape": '"'}

Scan = Callable[[DataFrame], DataFrame]


@dataclass(frozen=True)
class CsvHeader:
    """A file's header line: its column names, or why none of its rows can be read."""

    names: tuple[str, ...]
    problem: str | None = None
    has_line: bool = True  # the file's first line is the header (not a data row, not blank)


def read_csv_header(path: Location) -> CsvHeader:
    """The header of a CSV file, read on the driver (metadata: its first line only).

    The file is opened without following a symbolic link, at most HEADER_LIMIT bytes are read,
    and nothing of it is ever printed: problems are reasons for its rows, which quarantine
    keeps. A file that cannot be opened is an InputError naming the file, not its content.
    """
    try:
        opened = store_for(path).open_read(path)
    except OSError as error:
        raise InputError(
            f"CSV file {_landing_name(path)}: cannot read its header: {error.strerror or error}"
        ) from None
    with opened as handle:
        try:
            if path.name.lower().endswith(".gz"):  # as Spark reads it: by its extension
                with gzip.GzipFile(fileobj=handle) as unpacked:
                    first = unpacked.readline(HEADER_LIMIT + 1)
            else:
                first = handle.readline(HEADER_LIMIT + 1)
        except (OSError, EOFError) as error:
            return CsvHeader((), f"the file is not valid gzip data ({error})")
    if len(first) > HEADER_LIMIT:
        return CsvHeader((), f"the file's header line is longer than {HEADER_LIMIT} bytes")
    try:
        text = first.decode("utf-8").lstrip("\ufeff").rstrip("\r\n")
    except UnicodeDecodeError:
        return CsvHeader((), "the file's header line is not valid UTF-8 text")
    if not text.strip():
        # Spark skips blank lines: the first line read is then a data row, not the header.
        return CsvHeader((), "the file has no header line (its first line is empty)", False)
    names = tuple(name.strip() for name in next(csv.reader([text])))
    return CsvHeader(names)


def read_csv_changes(
    spark: SparkSession, table: TableConfig, paths: Sequence[Location], scan: Scan
) -> ChangeRead:
    """Change rows of CSV files: the declared columns (and flag) as text, with `_cdc_raw` and
    `_cdc_format_error` set for rows that cannot be read; `scan` adds the arrival columns to a
    text read (numbering each file's lines from 0)."""
    if table.columns is None:
        raise InputError(f"table {table.name}: file_format csv needs declared columns")
    headers = {path: read_csv_header(path) for path in paths}
    wanted = list(table.columns)
    flag_needed = table.change_format == "flat"
    if flag_needed and any(
        _position(h.names, table.flag_column) is not None for h in headers.values()
    ):
        wanted.append(table.flag_column)
    # Without a flag column in any file, none is added: the stage step then says so and stops.
    groups: dict[CsvHeader, list[Location]] = {}
    for path, header in headers.items():
        groups.setdefault(header, []).append(path)
    frames = []
    undeclared: set[str] = set()
    for header, group in groups.items():
        problem = header.problem or _missing_required(table, header.names)
        missing = [c for c in wanted if _position(header.names, c) is None]
        if header.has_line and problem is None and missing:
            for path in group:
                warn(
                    f"table {table.name}: {_landing_name(path)}: the header has no column "
                    f"{', '.join(missing)}; its rows read null there"
                )
        undeclared |= _undeclared(header.names, [*table.columns, table.flag_column])
        texts = spark.read.text([spark_path(p) for p in group])
        lines = scan(texts.filter(F.trim(F.col(LINE)) != ""))
        if header.has_line:
            # The header is each file's first line read; data rows are numbered from 0.
            lines = lines.filter(F.col(ROW) > 0).withColumn(ROW, F.col(ROW) - 1)
        lines = _mark_cut_rows(lines, [_arrival_key(p) for p in group if has_unterminated_row(p)])
        text_columns = {c for c, t in table.columns.items() if t.lower() == "string"}
        frames.append(_parse_lines(lines, header, wanted, problem, text_columns))
    if not frames:
        return ChangeRead(_empty(spark, wanted), dict(table.columns), columns=_columns(wanted))
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return ChangeRead(
        result, dict(table.columns), undeclared=sorted(undeclared), columns=_columns(wanted)
    )


def _columns(wanted: list[str]) -> list[str]:
    """The columns of the frame `_parse_lines` (and `_empty`) give."""
    return [*wanted, RAW, FORMAT_ERROR, *ARRIVAL]


def _parse_lines(
    lines: DataFrame,
    header: CsvHeader,
    wanted: list[str],
    problem: str | None,
    text_columns: set[str],
) -> DataFrame:
    """One header group's lines parsed into the wanted columns plus the row's format error; a
    quoted empty field is the empty string in a `string` column, null in the others (as an
    unquoted empty field is everywhere)."""
    width = len(header.names)
    valid = F.is_valid_utf8(F.col(LINE))
    text = F.when(valid, F.col(LINE)).otherwise(F.make_valid_utf8(F.col(LINE)))
    fields = [f"`__c{i}` STRING" for i in range(width)] + [f"`{CORRUPT}` STRING"]
    options = {"columnNameOfCorruptRecord": CORRUPT, "mode": "PERMISSIVE", "emptyValue": EMPTY}
    parsed = F.from_csv(text, ", ".join(fields), {**DIALECT, **options})
    error = F.coalesce(
        F.lit(problem).cast("string"),
        F.when(F.col(CUT), F.lit(UNTERMINATED)),
        F.when(~valid, F.lit(NOT_UTF8)),
        F.when(parsed[CORRUPT].isNotNull(), _field_count_reason(text, width)),
    )
    values = []
    for column in wanted:
        position = _position(header.names, column)
        value = parsed[f"__c{position}"] if position is not None else F.lit(None).cast("string")
        empty = F.lit("") if column in text_columns else F.lit(None).cast("string")
        values.append(F.when(value == EMPTY, empty).otherwise(value).alias(column))
    return lines.select(
        *values,
        F.when(error.isNotNull(), text).alias(RAW),
        error.alias(FORMAT_ERROR),
        *[F.col(c) for c in ARRIVAL],
    )


# Spark's CSV reader gives null for an unquoted empty field and for a quoted one (`""`) alike:
# the quoted one is read as this marker first and then as the empty string it is.
EMPTY = "\u0001cdc-empty\u0001"


def has_unterminated_row(path: Location) -> bool:
    """True when a file's last line holds text but no line end (metadata: its last TAIL_BYTES
    bytes, read on the driver). A gzip file is not looked into: cut, it is not valid gzip."""
    if path.name.lower().endswith(".gz"):
        return False
    try:
        with store_for(path).open_read(path) as handle:
            end = handle.seek(0, io.SEEK_END)
            handle.seek(max(0, end - TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return False  # its header read says why the file cannot be read
    last_break = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
    return bool(tail[last_break + 1 :].strip())


def _arrival_key(path: Location) -> str:
    """A landed file as its rows' `_cdc_batch`/`_cdc_file` ('2024-01-01T00/a.csv')."""
    day, hour, name = str(path).split("/")[-3:]
    return f"{day.removeprefix('dt=')}T{hour.removeprefix('hr=')}/{name}"


def _mark_cut_rows(lines: DataFrame, cut_files: list[str]) -> DataFrame:
    """`lines` with CUT: true for the last row of the files whose last row has no line end (no
    Spark work when there are none)."""
    if not cut_files:
        return lines.withColumn(CUT, F.lit(False))
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    last = F.max(ROW).over(Window.partitionBy(BATCH, FILE))
    return lines.withColumn(CUT, file_key.isin(cut_files) & (F.col(ROW) == last))


def _field_count_reason(text: Column, width: int) -> Column:
    """'row has 5 fields, the header has 4' (fields counted outside double-quoted parts)."""
    unquoted = F.regexp_replace(text, '"[^"]*"', "")
    count = F.size(F.split(unquoted, ",", -1))
    return F.when(
        count != width,
        F.concat(
            F.lit("row has "), count.cast("string"), F.lit(f" fields, the header has {width}")
        ),
    ).otherwise(F.lit(f"row does not split into the header's {width} fields"))


def _position(names: Sequence[str], column: str) -> int | None:
    """Where `column` is in a header (names match ignoring case, as Spark resolves them)."""
    for index, name in enumerate(names):
        if name.lower() == column.lower():
            return index
    return None


def _missing_required(table: TableConfig, names: Sequence[str]) -> str | None:
    """Why no row of a file can be applied: a column every row needs is not in its header,
    or a column is named twice."""
    declared = table.columns or {}
    lowered = [name.lower() for name in names]
    for column in [*declared, table.flag_column]:
        if lowered.count(column.lower()) > 1:
            return f"the file's header names column {column} more than once"
    needs = [(k, "a key column") for k in table.keys if k in declared]
    needs += [(c, "a sequence_by column") for c in table.sequence_by if c in declared]
    if table.change_format == "flat" and not table.insert_only:
        needs.append((table.flag_column, "the flag column"))
    for column, role in needs:
        if _position(names, column) is None:
            return f"the file's header has no column {column} ({role})"
    return None


def _undeclared(names: Sequence[str], known: Sequence[str]) -> set[str]:
    """Header names that are not declared columns; a name that is not an identifier is given by
    its position only (a warning never prints what a file holds)."""
    lowered = {k.lower() for k in known}
    found = set()
    for index, name in enumerate(names):
        if name.lower() in lowered:
            continue
        ok = re.match(COLUMN_PATTERN, name) and len(name) <= 128
        found.add(name if ok else f"<header field {index + 1}>")
    return found


def _empty(spark: SparkSession, columns: list[str]) -> DataFrame:
    names = _columns(columns)[:-1]  # (ROW, last, is a long)
    schema = ", ".join([*[f"`{c}` string" for c in names], f"{ROW} long"])
    return spark.createDataFrame([], schema)


def _landing_name(path: Location) -> str:
    """A landed file as `dt=.../hr=.../name` (where it is, never what it holds)."""
    return "/".join(str(path).split("/")[-3:])
