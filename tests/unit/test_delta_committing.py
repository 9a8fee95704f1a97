"""find_commit reads the log's commit files: our version and the data commits before it."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from spark_jobs.delta import RUN_ID_KEY, find_commit


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
