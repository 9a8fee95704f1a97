"""The long-run benchmark (`python -m cdc_tools.bench.long_run`) on a real Connect server: one
table's consecutive runs stay exact, and the tables the steps create keep their logs
checkpointed and the ledger and applied compact however many runs they take; a table started a
year in (its ledger holding earlier versions) is exact too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc_tools.bench import long_run
from spark_jobs.delta.committing import APPENDED_FILES_MAX

pytestmark = [pytest.mark.cli, pytest.mark.slow]

RUNS = APPENDED_FILES_MAX + 2


def test_consecutive_runs_keep_logs_checkpointed_and_appended_tables_compact(
    connect_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "long-run.json"
    argv = ["--runs", str(RUNS), "--remote", connect_server.url, "--output", str(output)]
    argv += ["--ledger-rows", "500"]  # one file each in the ledger and applied before run 1
    assert long_run.main(argv) == 0
    report = json.loads(output.read_text())
    assert [r["run"] for r in report["every_run"]] == list(range(1, RUNS + 1))
    assert [b["runs"] for b in report["blocks"]] == ["1-10", f"11-{RUNS}"]
    assert "runs    1-10: stage" in capsys.readouterr().out
    logs = report["logs_at_end"]
    assert {"staging", "final", "ledger", "applied", "tombstones"} <= set(logs)
    # Every run committed to staging, final, the ledger and applied: past a checkpoint each.
    for name in ("staging", "final", "ledger", "applied"):
        assert logs[name]["version"] >= RUNS - 1, name
        assert logs[name]["commits_since_checkpoint"] < 10, (name, logs[name])
    # The seeded file, then one a run, compacted at the tenth: RUNS - APPENDED_FILES_MAX + 2.
    assert logs["ledger"]["files"] == logs["applied"]["files"] == RUNS - APPENDED_FILES_MAX + 2
    assert report["ledger_rows"] == 500
    assert all(b["has_work_client_cpu"] > 0 for b in report["blocks"])
