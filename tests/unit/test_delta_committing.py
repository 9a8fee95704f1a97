"""find_commit reads the log's commit files: our version and the data commits before it; the
tables the steps create checkpoint every 10 commits, and the appended ones stay compact."""

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.delta import RUN_ID_KEY, TABLE_PROPERTIES, append_arrow, ensure_table, find_commit
from spark_jobs.delta.committing import APPENDED_FILES_MAX, STEP_KEY, compact
from spark_jobs.optimize import add_table_properties


def _write(path: Path, run_id: str) -> None:
    write_deltalake(
        str(path),
        pa.table({"a": [1]}),
        mode="append",
        commit_properties=CommitProperties(custom_metadata={RUN_ID_KEY: run_id}),
    )


def test_finds_our_version_and_the_data_commits_between(tmp_path: Path) -> None:
    for run_id in ("r0", "r1", "r2"):
        _write(tmp_path, run_id)
    # A property change is not a data commit: it does not count as interference.
    DeltaTable(str(tmp_path)).alter.set_table_properties({"delta.appendOnly": "false"})
    _write(tmp_path, "ours")
    _write(tmp_path, "r5")
    found = find_commit(tmp_path, 1, "ours")
    assert (found.version, found.interfering_versions) == (4, [2])
    assert find_commit(tmp_path, 3, "ours").interfering_versions == []


def test_a_missing_commit_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "r0")
    with pytest.raises(RuntimeError, match="commit of run nope not found"):
        find_commit(tmp_path, 0, "nope")


def test_appended_tables_checkpoint_and_stay_compact(tmp_path: Path) -> None:
    """The ledger and applied gain a file a run: every 10th append compacts them into one, and a
    checkpoint every 10 commits keeps their log short; no row is lost or repeated."""
    for n in range(25):
        append_arrow(tmp_path, pa.table({"n": [n], "name": [f"file-{n}"]}))
    table = DeltaTable(str(tmp_path))
    assert table.metadata().configuration == TABLE_PROPERTIES
    assert len(table.file_uris()) < APPENDED_FILES_MAX
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["n"]) == [
        {"n": n, "name": f"file-{n}"} for n in range(25)
    ]
    assert [h.get(STEP_KEY) for h in table.history()].count("compact") == 2
    assert (tmp_path / "_delta_log" / "_last_checkpoint").exists()
    last = json.loads((tmp_path / "_delta_log" / "_last_checkpoint").read_text())["version"]
    assert table.version() - last < 10


def test_compactions_at_once_keep_every_row_once(tmp_path: Path) -> None:
    """Of two compactions from one version one wins and the other writes nothing (delta-rs's
    OPTIMIZE let both commit, doubling every row); a compaction after an OPTIMIZE or an append
    it did not read writes nothing either (an overwrite there would keep both copies)."""
    for n in range(5):
        append_arrow(tmp_path, pa.table({"n": [n]}))
    first, second = DeltaTable(str(tmp_path)), DeltaTable(str(tmp_path))
    assert compact(first) is True
    assert compact(second) is False
    append_arrow(tmp_path, pa.table({"n": [5]}))
    third = DeltaTable(str(tmp_path))
    DeltaTable(str(tmp_path)).optimize.compact()
    assert compact(third) is False
    append_arrow(tmp_path, pa.table({"n": [6]}))
    fourth = DeltaTable(str(tmp_path))
    append_arrow(tmp_path, pa.table({"n": [7]}))
    assert compact(fourth) is False
    table = DeltaTable(str(tmp_path))
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == list(range(8))
    assert len(table.file_uris()) == 3


def test_created_tables_carry_the_properties(tmp_path: Path) -> None:
    schema = StructType([StructField("a", LongType())])
    ensure_table(tmp_path, schema, [])
    assert DeltaTable(str(tmp_path)).metadata().configuration == TABLE_PROPERTIES


def test_optimize_gives_older_tables_the_properties_and_keeps_their_own(tmp_path: Path) -> None:
    older, tuned = tmp_path / "older", tmp_path / "tuned"
    write_deltalake(str(older), pa.table({"a": [1]}))
    write_deltalake(
        str(tuned), pa.table({"a": [1]}), configuration={"delta.checkpointInterval": "5"}
    )
    for path in (older, tuned, tmp_path / "absent"):
        add_table_properties(path)
    assert DeltaTable(str(older)).metadata().configuration == TABLE_PROPERTIES
    assert DeltaTable(str(tuned)).metadata().configuration == {"delta.checkpointInterval": "5"}
    assert DeltaTable(str(tuned)).version() == 0  # nothing to add: no commit
