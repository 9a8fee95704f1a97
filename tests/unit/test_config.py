"""Config table validation: exact messages naming table, field and what is expected."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdc_pipeline.config import TableConfig, load_table_configs, parse_config
from cdc_pipeline.errors import ConfigError

GOOD = {
    "name": "orders",
    "file_format": "csv",
    "columns": {"ID": "bigint", "CREATE_DATE": "string", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def problems(*rows: dict, defaults: dict | None = None) -> list[str]:
    document: dict = {"tables": list(rows)}
    if defaults is not None:
        document["defaults"] = defaults
    return [str(p) for p in parse_config(document).problems]


def test_valid_row_gets_defaults_and_dag_id() -> None:
    result = parse_config({"tables": [GOOD]})
    table = result.tables["orders"]
    assert result.problems == []
    assert table.dag_id == "cdc_orders"
    assert table.flag_column == "FLAG"
    assert table.schedule == "@hourly"
    assert table.insert_only is False
    assert table.vacuum_retention_hours == 168


def test_defaults_are_merged_into_rows_and_rows_win() -> None:
    result = parse_config(
        {
            "defaults": {"schedule": "@daily", "flag_column": "OP"},
            "tables": [GOOD, {**GOOD, "name": "b", "schedule": "0 * * * *"}],
        }
    )
    assert result.tables["orders"].schedule == "@daily"
    assert result.tables["orders"].flag_column == "OP"
    assert result.tables["b"].schedule == "0 * * * *"


def test_unknown_field_is_rejected() -> None:
    assert problems({**GOOD, "partiton_column": "X"}) == [
        "table orders: partiton_column: unknown field; did you mean `partition_column`?"
    ]


def test_unknown_default_is_rejected() -> None:
    assert problems(GOOD, defaults={"shedule": "@daily"}) == [
        "table *: defaults.shedule: unknown field; did you mean `schedule`?"
    ]


def test_missing_required_fields() -> None:
    assert problems({"name": "x", "file_format": "parquet"}) == [
        "table x: keys: required field is missing",
        "table x: sequence_by: required field is missing",
    ]


def test_bad_name() -> None:
    assert problems({**GOOD, "name": "Orders"}) == [
        "table Orders: name: 'Orders' must be lower-case letters, digits and _, starting with a "
        "letter (e.g. orders_v2)"
    ]


def test_key_and_sequence_must_be_declared_columns() -> None:
    assert problems({**GOOD, "keys": ["IDX"], "sequence_by": ["TS2"]}) == [
        "table orders: keys: 'IDX' is not a declared column; did you mean `ID`? (declared: ID, "
        "CREATE_DATE, TS)",
        "table orders: sequence_by: 'TS2' is not a declared column; did you mean `TS`? (declared: "
        "ID, CREATE_DATE, TS)",
    ]


def test_columns_required_for_csv_only() -> None:
    row = {k: v for k, v in GOOD.items() if k != "columns"}
    assert problems(row) == [
        "table orders: columns: required for file_format csv (CSV values carry no types)"
    ]
    assert problems({**row, "file_format": "parquet"}) == []
    assert problems({**row, "file_format": "json"}) == []


def test_event_formats_default_to_json_and_the_source_order() -> None:
    row = {"name": "c", "change_format": "debezium", "keys": ["id"]}
    table = parse_config({"tables": [row]}).tables["c"]
    assert table.file_format == "json"
    assert table.sequence_by == ["_cdc_source_ts_ms", "_cdc_position"]
    assert table.flag_source == "_cdc_op"
    wal = parse_config({"tables": [{**row, "change_format": "wal2json"}]}).tables["c"]
    assert wal.sequence_by == ["_cdc_position"]
    assert problems({**row, "file_format": "csv", "columns": {"id": "int"}}) == [
        "table c: file_format: change_format debezium is read from JSON lines (file_format json)"
    ]
    assert problems({**row, "sequence_by": ["_cdc_nope"]}) == [
        "table c: sequence_by: '_cdc_nope' is not a column of change_format debezium (those are: "
        "_cdc_source_ts_ms, _cdc_lsn, _cdc_binlog_file, _cdc_binlog_pos, _cdc_binlog_row, "
        "_cdc_position)"
    ]
    declared = {**row, "columns": {"id": "int"}, "sequence_by": ["_cdc_lsn"]}
    assert problems(declared) == []
    assert problems({**row, "on_schema_change": "maybe"}) == [
        "table c: on_schema_change: 'maybe' is not one of evolve, quarantine"
    ]


def test_unknown_type_is_named() -> None:
    assert problems({**GOOD, "columns": {**GOOD["columns"], "X": "bigint2"}}) == [
        "table orders: columns: type 'bigint2' of X is not a Spark SQL type such as bigint, int, string, "
        "double, decimal(10,2), date, timestamp"
    ]


def test_a_nested_type_is_refused_as_nested_not_as_unknown() -> None:
    for nested in ("array<int>", "MAP<string, int>", "struct<a: int>"):
        assert problems({**GOOD, "columns": {**GOOD["columns"], "X": nested}}) == [
            f"table orders: columns: type {nested!r} of X is nested, and nested types are not "
            "supported (change rows are flat): flatten it into columns at the source"
        ]


def test_partition_expression_needs_partition_column() -> None:
    assert problems({**GOOD, "partition_expression": "year(TS)"}) == [
        "table orders: partition_column: partition_expression and partition_column go together (set both or neither)"
    ]


def test_partition_stable_needs_a_partition() -> None:
    assert problems({**GOOD, "partition_stable": True}) == [
        "table orders: partition_stable: needs partition_expression and partition_column"
    ]
    stable = {**GOOD, "partition_expression": "year(TS)", "partition_column": "Y"}
    assert problems({**stable, "partition_stable": True}) == []
    assert parse_config({"tables": [stable]}).tables["orders"].partition_stable is False


def test_partition_column_must_not_clash_with_a_column() -> None:
    assert problems({**GOOD, "partition_expression": "year(TS)", "partition_column": "ID"}) == [
        "table orders: partition_column: 'ID' clashes with a declared column"
    ]


def test_file_format_must_be_known() -> None:
    assert problems({**GOOD, "file_format": "avro"}) == [
        "table orders: file_format: 'avro' is not one of parquet, csv, json"
    ]


def test_bad_schedule() -> None:
    assert problems({**GOOD, "optimize_schedule": "every day"}) == [
        "table orders: optimize_schedule: 'every day' has 2 field(s); a cron has five fields "
        "'minute hour day-of-month month day-of-week' (e.g. '0 3 * * *')"
    ]


def test_reserved_prefix_and_flag_clash() -> None:
    assert problems(
        {**GOOD, "columns": {**GOOD["columns"], "_cdc_x": "int", "FLAG": "string"}}
    ) == [
        "table orders: columns: column name '_cdc_x' uses the reserved prefix _cdc_",
        # Reported in the same pass: the names of a mapping with a bad entry are still known.
        "table orders: flag_column: 'FLAG' must not also be a declared column",
    ]
    assert problems({**GOOD, "columns": {**GOOD["columns"], "FLAG": "string"}}) == [
        "table orders: flag_column: 'FLAG' must not also be a declared column"
    ]


def test_duplicate_table_names_are_both_reported_and_dropped() -> None:
    result = parse_config({"tables": [GOOD, GOOD]})
    assert [str(p) for p in result.problems] == [
        "table orders: name: appears more than once in the config table (also row 1); each "
        "table needs its own name"
    ]
    assert "orders" not in result.tables


def test_a_bad_row_does_not_hide_the_good_ones() -> None:
    result = parse_config(
        {"tables": [{**GOOD, "name": "bad", "keys": []}, {**GOOD, "name": "good"}]}
    )
    assert list(result.tables) == ["good"]
    assert [str(p) for p in result.problems] == [
        "table bad: keys: must not be empty (name at least one)"
    ]


def test_lookup_of_invalid_table_explains_why(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tables:\n  - name: bad\n    keys: [ID]\n    sequence_by: [ID]\n")
    with pytest.raises(ConfigError, match="table bad: sequence_by: ID already in keys"):
        load_table_configs(path).table("bad")
    with pytest.raises(
        ConfigError, match=r"table nope: not in the config table \(valid tables: none\)"
    ):
        load_table_configs(path).table("nope")


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    missing = load_table_configs(tmp_path / "missing.yaml")
    assert [p.field for p in missing.problems] == ["(file)"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("tables: [\n")
    assert str(load_table_configs(broken).problems[0]).endswith("is not valid YAML at line 2")


def test_alias_bombs_recursive_aliases_and_deep_nesting_are_refused_before_expansion(
    tmp_path: Path,
) -> None:
    laughs = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    cases = {
        "bomb": ("\n".join([*laughs, "tables: []"]), "line 6: its aliases expand to more than"),
        "recursive": (
            "a: &a [*a]\ntables: []",
            "line 1: an alias refers to a node that contains it",
        ),
        "deep": ("a: " + "[" * 60 + "]" * 60 + "\ntables: []", "nested more than 50 levels deep"),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text + "\n")
        (problem,) = load_table_configs(path).problems
        assert expected in str(problem), name
    # Ordinary anchors, as a defaults block shared by rows, stay valid.
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "base: &base {file_format: csv, keys: [ID], sequence_by: [TS], "
        "columns: {ID: bigint, TS: timestamp}}\n"
        "tables:\n  - {<<: *base, name: a}\n  - {<<: *base, name: b}\n"
    )
    result = load_table_configs(shared)
    assert sorted(result.tables) == ["a", "b"], [str(p) for p in result.problems]


def test_sample_config_is_valid() -> None:
    result = load_table_configs(Path(__file__).resolve().parents[2] / "config" / "tables.yaml")
    assert result.problems == []
    assert set(result.tables) >= {"orders", "customers", "events"}
    assert result.tables["orders"].keys == ["ORDER_ID", "LINE_NO"]
    assert result.tables["customers"].partition_column is None
    assert result.tables["events"].insert_only is True


def test_types_are_normalized() -> None:
    table = TableConfig.model_validate(
        {
            **GOOD,
            "columns": {"ID": "BIGINT", "TS": " Timestamp ", "A": "Decimal(10, 2)"},
            "sequence_by": ["TS"],
        }
    )
    assert table.columns == {"ID": "bigint", "TS": "timestamp", "A": "decimal(10, 2)"}


def test_snapshot_and_history_fields() -> None:
    snapshot = {
        "name": "s",
        "change_format": "snapshot",
        "columns": {"ID": "bigint", "V": "int", "LOADED": "string"},
        "keys": ["ID"],
        "compare_exclude": ["LOADED"],
        "history": True,
        "track_history_columns": ["V"],
    }
    table = parse_config({"tables": [snapshot]}).tables["s"]
    assert (table.file_format, table.sequence_by) == ("parquet", ["_cdc_snapshot_at"])
    assert table.history_buckets == 16
    assert problems({**snapshot, "compare_exclude": ["ID", "NOPE"]}) == [
        "table s: compare_exclude: 'NOPE' is not a declared column (declared: ID, V, LOADED)",
        "table s: compare_exclude: key columns are always compared",
    ]
    assert problems({**snapshot, "insert_only": True}) == [
        "table s: insert_only: a snapshot table derives updates and deletes",
        "table s: history: insert_only tables never change a row (no history to keep)",
    ]
    assert problems({**GOOD, "compare_exclude": ["TS"], "track_history_columns": ["ID"]}) == [
        "table orders: compare_exclude: only for change_format snapshot",
        "table orders: track_history_columns: needs history: true",
        "table orders: track_history_columns: key columns identify a row, not a version",
    ]
    assert problems({**GOOD, "history": True, "history_buckets": 0}) == [
        "table orders: history_buckets: 0 is too small (at least 1)"
    ]


def test_ignore_null_updates_is_for_flat_tables_with_updates() -> None:
    assert (
        parse_config({"tables": [{**GOOD, "ignore_null_updates": True}]})
        .tables["orders"]
        .ignore_null_updates
    )
    assert problems({**GOOD, "ignore_null_updates": True, "insert_only": True}) == [
        "table orders: ignore_null_updates: insert_only tables have no updates"
    ]
    wal2json = {"name": "w", "change_format": "wal2json", "keys": ["id"]}
    assert problems({**wal2json, "ignore_null_updates": True}) == [
        "table w: ignore_null_updates: only for change_format flat (wal2json tells a value not "
        "sent from a null itself)"
    ]
    snapshot = {"name": "s", "change_format": "snapshot", "keys": ["ID"]}
    assert problems({**snapshot, "ignore_null_updates": True}) == [
        "table s: ignore_null_updates: only for change_format flat (snapshot rows are full "
        "extracts: a null there is a null)"
    ]


def test_the_same_config_text_is_validated_once_per_process_and_never_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task process reads its config several times: the same text is validated once; a changed
    file is validated again; each caller gets its own result to change."""
    from cdc_pipeline.config import loader

    calls: list[int] = []
    real = loader.parse_config
    monkeypatch.setattr(loader, "parse_config", lambda *a: calls.append(1) or real(*a))
    path = tmp_path / "tables.yaml"
    row = {**GOOD, "name": "t"}
    path.write_text(yaml.safe_dump({"tables": [row]}))
    first = loader.load_table_configs(path)
    first.tables.clear()
    second = loader.load_table_configs(path)
    assert list(second.tables) == ["t"] and len(calls) == 1
    path.write_text(yaml.safe_dump({"tables": [row, {**row, "name": "u"}]}))
    assert list(loader.load_table_configs(path).tables) == ["t", "u"] and len(calls) == 2
