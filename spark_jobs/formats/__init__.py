"""JSON change formats read into one shape: flat FLAG rows, Debezium events, wal2json v2 lines.

Every line is parsed once with Spark SQL's `try_parse_json` (a VARIANT), so a line that is not
JSON is kept and quarantined, not lost. Each line becomes zero, one or two change rows:

- flat: the object is the row image; its flag column says I, U or D.
- debezium (with or without the `schema`/`payload` wrapper): `op` c and r insert, u updates,
  d deletes with the `before` image (or, without one, a top-level `key` object). A `u` whose
  `before` key differs from its `after` key is a primary-key change: a D of the old key and a
  U of the new one, from the same line, so the same run applies both. The sequence columns come
  from `source`: `_cdc_source_ts_ms`, `_cdc_lsn` (PostgreSQL), `_cdc_binlog_file`,
  `_cdc_binlog_pos` and `_cdc_binlog_row` (MySQL), and `_cdc_position`, a text that sorts in the
  connector's order (zero-padded LSN, or binlog file:pos:row).
- wal2json (format-version 2): `action` I, U, D with `columns` and `identity`; an update whose
  identity key differs from its new key is a primary-key change as above. `_cdc_lsn` is the
  line's `lsn` as a number and `_cdc_position` its zero-padded text ('' when absent).

Transaction markers (Debezium BEGIN/END, wal2json B/C), Kafka tombstones (a `null` line) and
unknown actions are counted and skipped.

A line of any shape never fails the batch: every value is read with `try_variant_get` (null
when it has another shape), maps are built only from distinct, non-null names, and a line that
is not valid UTF-8, not JSON, not an object, or whose fields have the wrong shape becomes a
quarantine row with the line in `_cdc_raw` and the reason. The column types come from `columns` when declared,
else from the format (Debezium's schema, wal2json's types), else from the JSON values.

By format: `flat`, `debezium` and `wal2json` (each format's parser), `json_lines` (what they
share: the line checks, the change rows, reading a field of any shape), `reading`
(`read_json_changes`: the lines of any JSON format read into typed change rows); `csv` (CSV
files, each line against its file's header) and `snapshot` (full extracts turned into changes
by hashes).
"""
