"""OpenLineage for real: one `airflow dags test` with the OpenLineage provider's file transport;
the COMPLETE events connect the landing folder -> staging -> final, each output with its schema
and the rows the step wrote, and final is the dataset of the table's asset."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_pipeline.paths import location_uri
from tests.e2e.airflow_env import AirflowEnv
from tests.helpers import Workspace, table_rows

pytestmark = pytest.mark.slow

ROW = {
    "name": "t_lineage",
    "file_format": "csv",
    "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "optimize_schedule": None,
    "vacuum_schedule": None,
    "reset_staging_schedule": None,
    "start_date": "2024-01-01",
}


@pytest.fixture
def airflow(tmp_path: Path) -> Iterator[tuple[AirflowEnv, Workspace]]:
    ws = Workspace(tmp_path)
    ws.config_path.write_text(yaml.safe_dump({"tables": [ROW]}))
    env = AirflowEnv(tmp_path / "home", ws.config_path, ws.landing, ws.warehouse, log_dir=tmp_path)
    env.migrate()
    try:
        env.start_spark()
        yield env, ws
    finally:
        env.stop()


def dataset(entry: dict[str, Any]) -> tuple[str, str]:
    return entry["namespace"], entry["name"]


def test_dags_test_emits_lineage_from_the_landing_folder_to_the_final_table(
    airflow: tuple[AirflowEnv, Workspace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, ws = airflow
    events_file = tmp_path / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(events_file), "append": True}
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(transport))
    ws.land(
        "t_lineage",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 10, "TS": "2024-01-01 00:00:01"},
            {"FLAG": "I", "ID": 2, "VALUE": 20, "TS": "2024-01-01 00:00:02"},
        ],
    )
    started = time.monotonic()
    env.airflow("dags", "test", "cdc_t_lineage", "2024-01-01T01:00:00+00:00")
    print(f"\ndags test with OpenLineage's file transport: {time.monotonic() - started:.1f} s")
    assert table_rows(ws.paths("t_lineage").final, ["ID", "VALUE"]) == [(1, 10), (2, 20)]

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    complete = {
        e["job"]["name"]: e
        for e in events
        if e["eventType"] == "COMPLETE" and "." in e["job"]["name"]
    }
    stage, overwrite = complete["cdc_t_lineage.stage"], complete["cdc_t_lineage.overwrite_final"]
    paths = ws.paths("t_lineage")

    def folder(location: Any) -> tuple[str, str]:
        return "file", str(Path(location).resolve())

    # stage: the landing folder -> staging (2 rows) and quarantine (none).
    assert [dataset(d) for d in stage["inputs"]] == [folder(paths.landing)]
    assert [dataset(d) for d in stage["outputs"]] == [
        folder(paths.staging),
        folder(paths.quarantine),
    ]
    rows = [d["outputFacets"]["outputStatistics"]["rowCount"] for d in stage["outputs"]]
    assert rows == [2, 0]
    # overwrite_final: staging -> final, with final's schema and the rows it wrote.
    (source,) = overwrite["inputs"]
    assert dataset(source) == folder(paths.staging)
    (final,) = overwrite["outputs"]
    assert dataset(final) == folder(paths.final)
    assert final["outputFacets"]["outputStatistics"]["rowCount"] == 2
    columns = [f["name"] for f in final["facets"]["schema"]["fields"]]
    assert {"ID", "VALUE", "TS"} <= set(columns)
    # The final dataset is the table's Airflow asset (cdc.t_lineage at final's URI).
    assert "file://" + final["name"] == location_uri(paths.final)
