"""Airflow operations for real: failure and quarantine notifications, a freshness deadline, the
table's asset triggering a downstream DAG, and a REST run without a logical date.

Its own Airflow (one more start, ~40 s) rather than the shared fixture of test_airflow.py: it needs
a DAG folder with a downstream DAG, the notifier registry Variable and its own tables, and it
leaves the other tests' Airflow as they expect it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_airflow.local.launcher import connect_connection
from cdc_pipeline.config import project_root
from cdc_pipeline.jvm import connect_address
from cdc_pipeline.paths import location_uri
from tests.e2e.airflow_env import AirflowEnv
from tests.helpers import Workspace, table_rows

# Each test runs several Spark steps through Airflow: on a loaded 2-core machine, past 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

# spark-submit locally, whatever the launcher's default connection becomes: the timeout test
# stops a spark-submit, o_fail's reason is its child's line. The other tables are clients of the session's Connect server (a JVM
# per task would cost 20-40 s each on 2 cores).
SPARK_SUBMIT = '{"conn_type": "spark", "host": "local[2]"}'
CONNECT_CONN_ID = "cdc_ops_connect"
PROBE_DAG = '''
"""Downstream of the CDC table o_rest: records the asset events that triggered it."""
import json
import os
from datetime import datetime, timezone

from airflow.sdk import DAG, task

from cdc_airflow.operations import table_asset

with DAG("ops_probe", schedule=[table_asset("o_rest")], start_date=datetime(2024, 1, 1, tzinfo=timezone.utc)):

    @task
    def record(triggering_asset_events=None):
        events = [
            {"uri": asset.uri, "extra": dict(event.extra)}
            for asset, asset_events in triggering_asset_events.items()
            for event in asset_events
        ]
        with open(os.environ["OPS_PROBE_OUT"], "a") as out:
            out.write(json.dumps(events) + "\\n")

    record()
'''


# One good row and two without a key: 2/3 quarantined, past a limit of 0.2.
TWO_OF_THREE_WITHOUT_KEY: list[dict[str, Any]] = [
    {"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:01"},
    {"FLAG": "I", "ID": None, "VALUE": 2, "TS": "2024-01-01 00:00:02"},
    {"FLAG": "I", "ID": None, "VALUE": 3, "TS": "2024-01-01 00:00:03"},
]


def row(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "file_format": "csv",
        "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "optimize_schedule": None,
        "vacuum_schedule": None,
        "reset_staging_schedule": None,
        "start_date": "2024-01-01",
        "retries": 0,
        "notify": ["record"],
        **extra,
    }


@dataclass
class OpsAirflow(AirflowEnv):
    """The launcher's Airflow reading a test DAG folder (the CDC DAG file plus a downstream DAG)."""

    dags_folder: Path | None = None
    probe_out: Path | None = None
    notifiers: str = "{}"
    connect_url: str = ""

    def environment(self) -> dict[str, str]:
        env = super().environment()
        host, port = connect_address(self.connect_url)
        env[f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}"] = connect_connection(port, host)
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(self.dags_folder)
        env["OPS_PROBE_OUT"] = str(self.probe_out)
        # Deadline callbacks may not read Variables through the execution API (Airflow 3.3):
        # the registry is also defined the way Airflow reads a Variable from the environment.
        env["AIRFLOW_VAR_CDC_NOTIFIERS"] = self.notifiers
        return env


@pytest.fixture(scope="module")
def ops(
    tmp_path_factory: pytest.TempPathFactory, connect_server: Any
) -> Iterator[tuple[OpsAirflow, Workspace, Path]]:
    root = tmp_path_factory.mktemp("ops")
    ws = Workspace(root)
    connect = {"spark_conn_id": CONNECT_CONN_ID}
    tables = [
        row("o_fail"),  # its failure as the spark-submit child prints it
        row("o_quarantine", max_quarantine_fraction=0.2, quarantine_action="fail", **connect),
        row("o_qwarn", max_quarantine_fraction=0.2, quarantine_action="warn", **connect),
        row("o_rest", freshness="1s", **connect),
        row("o_timeout", execution_timeout="3s", dagrun_timeout="1h"),
    ]
    ws.config_path.write_text(yaml.safe_dump({"tables": tables}))
    dags = root / "dags"
    dags.mkdir()
    (dags / "cdc_tables.py").write_text((project_root() / "dags" / "cdc_tables.py").read_text())
    (dags / "ops_probe.py").write_text(PROBE_DAG)
    alerts = root / "alerts.jsonl"
    registry = json.dumps({"record": {"kind": "jsonl", "path": str(alerts)}})
    env = OpsAirflow(
        root / "airflow_home",
        ws.config_path,
        ws.landing,
        ws.warehouse,
        spark_connection=SPARK_SUBMIT,
        log_dir=root,
        dags_folder=dags,
        probe_out=root / "probe.jsonl",
        notifiers=registry,
        connect_url=connect_server.url,
    )
    env.migrate()  # the metadata DB and every table's pool (one `airflow pools import`)
    env.airflow("variables", "set", "cdc_notifiers", registry)  # what tasks read
    try:
        yield env, ws, alerts
    finally:
        env.stop()


def alerts_of(path: Path, table: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["table"] == table]


def view_runs(env: OpsAirflow, dag_id: str) -> list[dict[str, Any]]:
    """The runs the CDC tables view reads for a DAG (its recent_runs, as JSON)."""
    code = (
        "from cdc_airflow.view.runs import recent_runs, run_document\n"
        f"print(json.dumps([run_document(r) for r in recent_runs([{dag_id!r}])[{dag_id!r}]]))\n"
    )
    runs: list[dict[str, Any]] = _printed(env, code)
    return runs


def view_row(env: OpsAirflow, table: str) -> dict[str, Any]:
    """The CDC tables view's row of a table (its health and reasons among them), as JSON."""
    code = (
        "from cdc_airflow.view.status import all_table_status\n"
        f"print(json.dumps([s.as_dict() for s in all_table_status() if s.name == {table!r}]))\n"
    )
    (found,) = _printed(env, code)
    return dict(found)


def _printed(env: OpsAirflow, code: str) -> Any:
    """The JSON a Python snippet prints last, run with this Airflow's environment."""
    result = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        env=env.environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_failed_step_and_a_quarantine_past_its_limit_reach_the_notifier(
    ops: tuple[OpsAirflow, Workspace, Path],
) -> None:
    env, ws, alerts = ops
    # o_fail: a change file without the flag column fails the stage step.
    ws.land(
        "o_fail", "2024-01-01T00", "a.csv", [{"ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:01"}]
    )
    # o_quarantine: two of three rows have no key (2/3 > 0.2, action fail).
    ws.land(
        "o_quarantine",
        "2024-01-01T00",
        "a.csv",
        TWO_OF_THREE_WITHOUT_KEY,
    )
    for table in ("o_fail", "o_quarantine"):
        env.airflow("dags", "test", f"cdc_{table}", "2024-01-01T01:00:00+00:00", check=False)
        (run,) = env.runs(f"cdc_{table}")
        assert run["state"] == "failed"
        states = env.task_states(f"cdc_{table}", run["run_id"])
        assert (states["stage"], states["overwrite_final"]) == ("failed", "upstream_failed")

    (failed,) = alerts_of(alerts, "o_fail")
    assert (failed["kind"], failed["task_id"], failed["dag_id"]) == (
        "task_failed",
        "stage",
        "cdc_o_fail",
    )
    assert "no flag column FLAG" in failed["message"]
    # The CDC tables view's data: the failed run with its failed task and the step's own line
    # (from the spark-submit child), read from this Airflow's metadata DB.
    (viewed,) = view_runs(env, "cdc_o_fail")
    assert viewed["state"] == "failed" and viewed["started"] is not None
    [stage_failure] = viewed["failures"]  # not the tasks after it (upstream_failed)
    print(f"\nthe view's failure of o_fail: {stage_failure}")
    assert stage_failure["task_id"] == "stage"
    assert stage_failure["reason"].startswith("error: stage o_fail: ")
    assert "no flag column FLAG" in stage_failure["reason"]

    # One alert for the quarantine: the failure it causes is not announced a second time.
    (quarantine,) = alerts_of(alerts, "o_quarantine")
    assert quarantine["kind"] == "quarantine"
    details = quarantine["details"]
    assert (details["rows_read"], details["quarantined"], details["action"]) == (3, 2, "fail")
    assert len(details["reasons"]) == 1 and details["reasons"][0].startswith("2 x ")
    assert "quarantined 2 of 3 rows (66.7%)" in quarantine["message"]
    # The stage committed its good row to staging; final waits for the operator.
    assert not (ws.paths("o_quarantine").final / "_delta_log").exists()


def test_a_quarantine_past_its_limit_with_action_warn_applies_and_fails_the_check_task(
    ops: tuple[OpsAirflow, Workspace, Path],
) -> None:
    """quarantine_action warn: the good rows reach final, and the run ends in a visible warning
    state (its check task failed, not due or not, without retry); one alert, not two; the view
    reads that failure as the table's quarantine warning, not as a failed run."""
    env, ws, alerts = ops
    ws.land(
        "o_qwarn",
        "2024-01-01T00",
        "a.csv",
        TWO_OF_THREE_WITHOUT_KEY,
    )
    env.airflow("dags", "test", "cdc_o_qwarn", "2024-01-01T01:00:00+00:00", check=False)
    (run,) = env.runs("cdc_o_qwarn")
    assert run["state"] == "failed"
    states = env.task_states("cdc_o_qwarn", run["run_id"])
    assert (states["stage"], states["overwrite_final"], states["check"]) == (
        "success",
        "success",
        "failed",
    )
    assert table_rows(ws.paths("o_qwarn").final, ["ID", "VALUE"]) == [(1, 1)]
    (quarantine,) = alerts_of(alerts, "o_qwarn")
    assert (quarantine["kind"], quarantine["details"]["action"]) == ("quarantine", "warn")
    (viewed,) = view_runs(env, "cdc_o_qwarn")
    [check_failure] = viewed["failures"]
    assert check_failure["task_id"] == "check"
    assert check_failure["reason"].startswith(
        "quarantine limit exceeded: table o_qwarn: stage quarantined 2 of 3 rows (66.7%)"
    )
    row = view_row(env, "o_qwarn")
    print(f"\nthe view's health of o_qwarn: {row['health']} {row['reasons']}")
    assert row["health"] == "warn"
    assert row["reasons"] == ["last stage run quarantined 66.7% of its rows (limit 20.0%)"]
    # The drill-down reads the rows this stage quarantined: values, file and row in it.
    drill = subprocess.run(
        [str(Path(sys.executable).parent / "cdc"), "quarantine", "o_qwarn", "--json"],
        env=env.environment(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert drill.returncode == 0, drill.stderr[-3000:]
    held = json.loads(drill.stdout.strip().splitlines()[-1])["quarantine"]
    assert [(s["file"], s["row"], s["reason"], s["values"]["VALUE"]) for s in held["samples"]] == [
        ("a.csv", 1, "null key column ID", "2"),
        ("a.csv", 2, "null key column ID", "3"),
    ]


def test_a_task_past_its_execution_timeout_is_stopped_with_its_spark_work(
    ops: tuple[OpsAirflow, Workspace, Path],
) -> None:
    env, ws, alerts = ops
    ws.land(
        "o_timeout",
        "2024-01-01T00",
        "a.csv",
        [{"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:01"}],
    )
    env.airflow("dags", "test", "cdc_o_timeout", "2024-01-01T01:00:00+00:00", check=False)
    (run,) = env.runs("cdc_o_timeout")
    assert env.task_states("cdc_o_timeout", run["run_id"])["stage"] == "failed"
    (failed,) = alerts_of(alerts, "o_timeout")
    assert (failed["kind"], failed["task_id"]) == ("task_failed", "stage")
    assert failed["message"].startswith("AirflowTaskTimeout")

    # on_kill stopped the spark-submit (and its JVM): no process of this step is left.
    def left() -> list[str]:
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
        marks = ("cdc-o_timeout-stage", "stage.py o_timeout")
        return [line for line in ps.stdout.splitlines() if any(m in line for m in marks)]

    until = time.monotonic() + 15
    while left() and time.monotonic() < until:
        time.sleep(1)
    assert left() == []
    assert not (ws.paths("o_timeout").staging / "_delta_log").exists()


def test_a_rest_run_without_logical_date_takes_the_latest_interval_feeds_the_asset_and_misses_its_deadline(
    ops: tuple[OpsAirflow, Workspace, Path],
) -> None:
    env, ws, alerts = ops
    ws.land(
        "o_rest",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 10, "TS": "2024-01-01 00:00:01"},
            {"FLAG": "I", "ID": 2, "VALUE": 20, "TS": "2024-01-01 00:00:02"},
        ],
    )
    # The next hour is not complete at run_after 01:30: the run must leave it alone.
    ws.land(
        "o_rest",
        "2024-01-01T01",
        "a.csv",
        [
            {"FLAG": "I", "ID": 3, "VALUE": 30, "TS": "2024-01-01 01:00:01"},
        ],
    )
    env.start_services()
    env.airflow("dags", "reserialize")
    # Triggered while paused, then unpaused: it is queued before the hour the scheduler adds on
    # unpausing, and runs first (max_active_runs=1).
    run = env.trigger(
        "cdc_o_rest",
        "rest_no_logical_date",
        {"logical_date": None, "run_after": "2024-01-01T01:30:00Z"},
    )
    env.api("PATCH", "/dags/ops_probe", {"is_paused": False})
    env.api("PATCH", "/dags/cdc_o_rest", {"is_paused": False})
    assert run["logical_date"] is None and run["data_interval_start"] is None
    assert env.finished_state("cdc_o_rest", run, 1200, ["cdc_o_rest", "ops_probe"]) == "success"
    assert table_rows(ws.paths("o_rest").final, ["ID", "VALUE"]) == [(1, 10), (2, 20)]

    # The asset event carried the run's interval and counts to the downstream DAG. (Unpausing
    # also scheduled the latest hour, whose run feeds the asset too: look for ours.)
    def probed() -> list[dict[str, Any]]:
        out = env.probe_out or Path()
        lines = out.read_text().splitlines() if out.exists() else []
        events = [e for line in lines for e in json.loads(line)]
        return [e for e in events if e["extra"]["data_interval_start"].startswith("2024-01-01")]

    until = time.monotonic() + 300
    while not probed() and time.monotonic() < until:
        time.sleep(3)
    (event,) = probed()
    assert event["uri"] == location_uri(ws.paths("o_rest").final)  # the asset cdc.o_rest
    assert event["extra"]["data_interval_start"] == "2024-01-01T00:00:00+00:00"
    assert event["extra"]["data_interval_end"] == "2024-01-01T01:00:00+00:00"
    assert (event["extra"]["counts"]["changes"], event["extra"]["counts"]["rows_written"]) == (2, 2)

    # freshness 1s: a run of three tasks takes longer, so the deadline alert went out (by the
    # scheduler). (With 5s a run on a fast machine succeeded first and its deadline was pruned.)
    def ours() -> list[dict[str, Any]]:
        return [a for a in alerts_of(alerts, "o_rest") if a["run_id"] == "rest_no_logical_date"]

    # Two senders: overwrite_final's stale_data and the scheduler's deadline callback; either
    # may come first, so wait for both kinds.
    until = time.monotonic() + 120
    kinds = {"deadline_missed", "stale_data"}
    while kinds - {a["kind"] for a in ours()} and time.monotonic() < until:
        time.sleep(2)
    (missed,) = [a for a in ours() if a["kind"] == "deadline_missed"]
    assert missed["run_id"] == "rest_no_logical_date"
    assert "within 1s of being queued" in missed["message"]
    # Freshness by data too: hour 01's file, landed in a folder outside the window of a run
    # ending now, is not applied: overwrite_final said so.
    (stale,) = [a for a in ours() if a["kind"] == "stale_data"]
    assert stale["details"]["files_outside_window"] == 1
    assert "1 file(s) outside the late_arrival_window" in stale["message"]
