"""A corpus of broken config files, each with the exact lines `cdc validate` prints for it.

Every problem of every row is reported in one pass, with the file's line, the table, the field,
what is wrong in the project's words and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_pipeline.config import load_table_configs

ROW = "    file_format: csv\n    columns: {ID: bigint, TS: timestamp}\n    keys: [ID]\n    sequence_by: [TS]\n"
CRON_HELP = "a cron has five fields 'minute hour day-of-month month day-of-week' (e.g. '0 3 * * *')"
RANGE = "a value is out of range: minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-6"

CORPUS: list[tuple[str, str, list[str]]] = [
    (
        "cron_out_of_range",
        f"tables:\n  - name: a\n{ROW}    schedule: '99 * * * *'\n    optimize_schedule: '0 25 * * *'\n",
        [
            f"t.yaml:7: table a: schedule: '99 * * * *' is not a valid cron ({RANGE}); {CRON_HELP}",
            f"t.yaml:8: table a: optimize_schedule: '0 25 * * *' is not a valid cron ({RANGE}); {CRON_HELP}",
        ],
    ),
    (
        "once_is_not_a_cadence",
        f"tables:\n  - name: a\n{ROW}    schedule: '@once'\n",
        [
            "t.yaml:7: table a: schedule: '@once' is not a cadence: a CDC table's runs own "
            "consecutive data intervals; use a preset or a cron (a one-off load is `cdc run "
            "TABLE --start .. --end ..`)"
        ],
    ),
    (
        "cron_that_never_fires_and_unknown_preset_and_six_fields",
        f"tables:\n  - name: a\n{ROW}    vacuum_schedule: '0 0 30 2 *'\n"
        "    reset_staging_schedule: '@fortnightly'\n    optimize_schedule: '* * * * * *'\n",
        [
            "t.yaml:7: table a: vacuum_schedule: '0 0 30 2 *' never fires (no date matches it)",
            "t.yaml:8: table a: reset_staging_schedule: '@fortnightly' is not a preset (presets: "
            "@hourly, @daily, @midnight, @weekly, @monthly, @quarterly, @yearly, @annually)",
            f"t.yaml:9: table a: optimize_schedule: '* * * * * *' has 6 field(s); {CRON_HELP}",
        ],
    ),
    (
        "bad_name_and_type_still_get_cross_field_checks",
        "tables:\n  - name: Bad-Name\n    file_format: csv\n"
        "    columns: {ID: bigint, TS: timestamp, X: bigint2}\n    keys: [IDX]\n"
        "    sequence_by: [TSS]\n    partition_expression: year(TS)\n",
        [
            "t.yaml:2: table Bad-Name: name: 'Bad-Name' must be lower-case letters, digits and _, "
            "starting with a letter (e.g. orders_v2)",
            "t.yaml:2: table Bad-Name: partition_column: partition_expression and "
            "partition_column go together (set both or neither)",
            "t.yaml:4: table Bad-Name: columns: type 'bigint2' of X is not a Spark SQL type such "
            "as bigint, int, string, double, decimal(10,2), date, timestamp",
            "t.yaml:5: table Bad-Name: keys: 'IDX' is not a declared column; did you mean `ID`? "
            "(declared: ID, TS, X)",
            "t.yaml:6: table Bad-Name: sequence_by: 'TSS' is not a declared column; did you mean "
            "`TS`? (declared: ID, TS, X)",
        ],
    ),
    (
        "misspelt_change_format_adds_no_sequence_by_problem",
        "tables:\n  - name: c\n    change_format: wal2jsn\n    keys: [id]\n",
        [
            "t.yaml:3: table c: change_format: 'wal2jsn' is not one of flat, debezium, wal2json, "
            "snapshot; did you mean `wal2json`?"
        ],
    ),
    (
        "duplicate_name_when_the_first_copy_is_invalid",
        f"tables:\n  - name: d\n    keys: []\n    sequence_by: [TS]\n  - name: d\n{ROW}",
        [
            "t.yaml:3: table d: keys: must not be empty (name at least one)",
            "t.yaml:5: table d: name: appears more than once in the config table (also row 1); "
            "each table needs its own name",
        ],
    ),
    (
        "duplicate_yaml_keys_in_columns_and_in_a_row",
        "tables:\n  - name: e\n    file_format: csv\n    columns:\n      ID: bigint\n"
        "      TS: timestamp\n      ID: string\n    keys: [ID]\n    sequence_by: [TS]\n"
        "    keys: [TS]\n",
        [
            "t.yaml:7: table e: columns: key 'ID' appears twice (lines 5 and 7); keep one (YAML "
            "would silently keep the last)",
            "t.yaml:9: table e: sequence_by: TS already in keys",
            "t.yaml:10: table e: keys: key 'keys' appears twice (lines 8 and 10); keep one (YAML "
            "would silently keep the last)",
        ],
    ),
    (
        "unknown_fields_get_a_did_you_mean",
        f"defaults:\n  shedule: '@daily'\ntables:\n  - name: a\n{ROW}    colums: {{ID: int}}\n"
        "    zzz: 1\n",
        [
            "t.yaml:2: table *: defaults.shedule: unknown field; did you mean `schedule`?",
            "t.yaml:9: table a: colums: unknown field; did you mean `columns`?",
            "t.yaml:10: table a: zzz: unknown field (see README, The config table, for the fields)",
        ],
    ),
    (
        "a_bad_default_is_reported_at_the_defaults_line",
        f"defaults:\n  optimize_schedule: 'every day'\ntables:\n  - name: a\n{ROW}",
        [
            f"t.yaml:2: table a: optimize_schedule: 'every day' has 2 field(s); {CRON_HELP}",
        ],
    ),
    (
        "partition_expression_reading_a_file_or_calling_java",
        f"tables:\n  - name: a\n{ROW}    partition_column: P\n"
        '    partition_expression: "(SELECT first(value) FROM text.`/etc/hostname`)"\n'
        f"  - name: b\n{ROW}    partition_column: P\n"
        "    partition_expression: \"reflect('java.lang.System', 'getenv', 'HOME')\"\n",
        [
            "t.yaml:8: table a: partition_expression: '(SELECT first(value) FROM "
            "text.`/etc/hostname`)' refused: a subquery or table/file read is not allowed (only "
            "columns of the change row); aggregate function first() is not allowed (the value "
            "must come from the row alone); 'value' is not a declared column",
            "t.yaml:15: table b: partition_expression: \"reflect('java.lang.System', 'getenv', "
            "'HOME')\" refused: reflect() calls Java methods by reflection",
        ],
    ),
    (
        "names spark cannot tell apart and a vacuum the schedule would refuse",
        "tables:\n  - name: a\n    file_format: csv\n    columns: {ID: bigint, id: string, TS: timestamp}\n"
        "    keys: [ID]\n    sequence_by: [TS]\n    flag_column: ts\n    partition_column: Id\n"
        "    partition_expression: year(TS)\n    vacuum_retention_hours: 24\n"
        "  - name: b\n" + ROW + "    partition_column: _cdc_p\n    partition_expression: year(TS)\n"
        "    vacuum_retention_hours: 24\n    vacuum_schedule: null\n",
        [
            "t.yaml:4: table a: columns: column names ID and id differ only in case (Spark does "
            "not tell them apart)",
            "t.yaml:7: table a: flag_column: 'ts' must not also be a declared column",
            "t.yaml:8: table a: partition_column: 'Id' clashes with a declared column (ID, id; "
            "Spark ignores case)",
            "t.yaml:10: table a: vacuum_retention_hours: 24 is below 168, which the scheduled "
            "vacuum refuses; use at least 168, or vacuum_schedule: null and `cdc vacuum --force` "
            "by hand",
            "t.yaml:16: table b: partition_column: '_cdc_p' uses the reserved prefix _cdc_",
        ],
    ),
    (
        "wrong_value_kinds_in_the_projects_words",
        f"tables:\n  - name: a\n{ROW}    insert_only: maybe\n    history_buckets: 0\n"
        "    start_date: soon\n    on_schema_change: evolv\n",
        [
            "t.yaml:7: table a: insert_only: 'maybe' is not true or false",
            "t.yaml:8: table a: history_buckets: 0 is too small (at least 1)",
            "t.yaml:9: table a: start_date: 'soon' is not a date such as 2024-01-01",
            "t.yaml:10: table a: on_schema_change: 'evolv' is not one of evolve, quarantine; did "
            "you mean `evolve`?",
        ],
    ),
    (
        "kafka_rows_name_their_own_topic_and_no_file_fields",
        "tables:\n  - name: a\n    source: kafka\n    change_format: wal2json\n"
        "    late_arrival_window: 2d\n    keys: [id]\n"
        "  - name: b\n    source: kafka\n    topic: 'orders events'\n    file_format: csv\n"
        "    columns: {ID: bigint, TS: timestamp}\n    keys: [ID]\n    sequence_by: [TS]\n"
        "  - name: c\n    source: kafka\n    topic: orders\n    columns: {ID: bigint, TS: timestamp}\n"
        "    keys: [ID]\n    sequence_by: [TS]\n"
        "  - name: d\n    source: kafka\n    topic: orders\n    columns: {ID: bigint, TS: timestamp}\n"
        "    keys: [ID]\n    sequence_by: [TS]\n"
        f"  - name: e\n{ROW}    topic: orders\n    starting_offsets: latest\n",
        [
            "t.yaml:2: table a: topic: required for source kafka (the topic holding this table's "
            "changes)",
            "t.yaml:4: table a: change_format: wal2json is not read from Kafka (a message's value "
            "is one JSON change: debezium or flat)",
            "t.yaml:5: table a: late_arrival_window: only for source files (a Kafka table reads "
            "every message not staged yet)",
            "t.yaml:9: table b: topic: 'orders events' is not a Kafka topic name (letters, digits, "
            "'.', '_' and '-'; at most 249)",
            "t.yaml:10: table b: file_format: csv is for landed files; a Kafka message's value is "
            "JSON (omit file_format)",
            "t.yaml:22: table d: topic: 'orders' is also the topic of row 3; a table reads only "
            "its own topic (one topic per source table)",
            "t.yaml:31: table e: topic: only for source kafka (this row reads files: set source: "
            "kafka)",
            "t.yaml:32: table e: starting_offsets: only for source kafka (this row reads files: "
            "set source: kafka)",
        ],
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in CORPUS], ids=[n for n, _, _ in CORPUS]
)
def test_broken_config_gives_exactly_these_lines(
    text: str, expected: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)  # the file is shown as the user names it: relative to here
    result = load_table_configs("t.yaml")
    assert [str(p) for p in result.problems] == expected
    assert result.tables == {}


def test_every_corpus_row_is_valid_once_fixed(tmp_path: Path) -> None:
    # The corpus' base row is valid: each case fails for its own reason only.
    (tmp_path / "t.yaml").write_text(f"tables:\n  - name: a\n{ROW}")
    result = load_table_configs(tmp_path / "t.yaml")
    assert (result.problems, list(result.tables)) == ([], ["a"])
