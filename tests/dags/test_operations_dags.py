"""The operations settings of a config row as the parsed DAG's timeouts, pools, retries, asset,
callbacks and freshness deadline; the interval template of a run without a logical date."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from cdc_airflow.alerts import CdcNotifier, CdcRunTimeoutNotifier, deadline_missed
from cdc_airflow.operations import FillRunInterval, PublishCounts, QuarantineCheck
from cdc_pipeline.config import parse_config
from cdc_pipeline.planning import plan_table_dag

DAGS = Path(__file__).resolve().parents[2] / "dags"
ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
OPS = {
    "execution_timeout": "20m",
    "dagrun_timeout": "1h30m",
    "retries": 4,
    "freshness": "2h",
    "notify": ["ops_email", "audit"],
    "max_quarantine_fraction": 0.1,
    "quarantine_action": "fail",
}


def dag_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: dict):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    config = tmp_path / "tables.yaml"
    config.write_text(yaml.safe_dump({"tables": [row]}))
    monkeypatch.setenv("CDC_CONFIG", str(config))
    bag = DagBag(dag_folder=str(DAGS / "cdc_tables.py"))
    assert bag.import_errors == {}
    return bag.dags[f"cdc_{row['name']}"]


def test_the_plan_carries_the_rows_operations_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    table = parse_config({"tables": [{**ROW, **OPS}]}).tables["t"]
    plan = plan_table_dag(table)
    assert plan.dagrun_timeout == timedelta(hours=1, minutes=30)
    assert plan.freshness == timedelta(hours=2)
    assert (plan.notify, plan.max_quarantine_fraction, plan.quarantine_action) == (
        ("ops_email", "audit"),
        0.1,
        "fail",
    )
    by_id = {task.task_id: task for task in plan.tasks}
    assert {task.execution_timeout for task in plan.tasks} == {timedelta(minutes=20)}
    assert {task.retries for task in plan.tasks} == {4}
    # Rewrites and maintenance share the table's pool; stage appends and check reads: no pool.
    assert {task_id: task.pool for task_id, task in by_id.items()} == {
        "stage": None,
        "overwrite_final": "cdc_t",
        "reset_staging": "cdc_t",
        "optimize": "cdc_t",
        "vacuum": "cdc_t",
        "check": None,
    }
    assert {task_id: task.outlets for task_id, task in by_id.items() if task.outlets} == {
        "overwrite_final": ((tmp_path / "warehouse" / "t" / "final").resolve().as_uri(),)
    }


def test_the_defaults_give_timeouts_and_no_deadline_or_notifier() -> None:
    plan = plan_table_dag(parse_config({"tables": [ROW]}).tables["t"])
    assert plan.dagrun_timeout == timedelta(hours=3)
    assert {task.execution_timeout for task in plan.tasks} == {timedelta(hours=1)}
    assert {task.retries for task in plan.tasks} == {2}
    assert (plan.freshness, plan.notify, plan.max_quarantine_fraction) == (None, (), 0.05)


def test_the_parsed_dag_has_timeouts_pools_asset_callbacks_and_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk import Asset
    from airflow.sdk.definitions.callback import SyncCallback
    from airflow.sdk.definitions.deadline import DeadlineReference

    dag = dag_of(tmp_path, monkeypatch, {**ROW, **OPS})
    assert dag.dagrun_timeout == timedelta(hours=1, minutes=30)
    assert dag.max_active_runs == 1
    run_notifier = dag.on_failure_callback
    assert isinstance(run_notifier, CdcRunTimeoutNotifier)
    assert (run_notifier.names, run_notifier.dagrun_timeout) == (["ops_email", "audit"], "1h30m")
    for task in dag.tasks:
        assert task.execution_timeout == timedelta(minutes=20)
        assert task.retries == 4
        (notifier,) = task.on_failure_callback
        assert isinstance(notifier, CdcNotifier)
        assert (notifier.table, notifier.names) == ("t", ["ops_email", "audit"])
        assert isinstance(task._pre_execute_hook, FillRunInterval)
    # An Airflow nobody prepared has no table pools: every task is in default_pool, and each
    # task of the table runs one at a time across its runs.
    assert {task.pool for task in dag.tasks} == {"default_pool"}
    assert {task.max_active_tis_per_dag for task in dag.tasks} == {1}
    monkeypatch.setenv("CDC_TABLE_POOLS", "1")  # the deployment created one pool per table
    pooled = dag_of(tmp_path, monkeypatch, {**ROW, **OPS})
    assert pooled.get_task("stage").pool == "default_pool"
    assert pooled.get_task("optimize").pool == "cdc_t"
    monkeypatch.setenv("CDC_WAREHOUSE", "s3://lake/warehouse")
    dag = dag_of(tmp_path, monkeypatch, {**ROW, **OPS})
    final = Asset(name="s3://lake/warehouse/t/final", uri="s3://lake/warehouse/t/final")
    assert dag.get_task("overwrite_final").outlets == [final]
    check = dag.get_task("stage")._post_execute_hook
    assert check == QuarantineCheck("t", 0.1, "fail", ("ops_email", "audit"))
    assert dag.get_task("overwrite_final")._post_execute_hook == PublishCounts(
        final, "t", "2h", ("ops_email", "audit")
    )
    (deadline,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert deadline.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert deadline.interval == timedelta(hours=2)
    assert deadline.callback == SyncCallback(
        deadline_missed, kwargs={"table": "t", "notify": ["ops_email", "audit"], "freshness": "2h"}
    )


def test_without_notify_or_freshness_there_is_no_callback_or_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dag = dag_of(tmp_path, monkeypatch, {**ROW, "max_quarantine_fraction": None})
    assert not dag.deadline
    assert not dag.on_failure_callback
    assert all(not task.on_failure_callback for task in dag.tasks)
    assert dag.get_task("stage")._post_execute_hook is None


def test_the_interval_arguments_render_for_scheduled_and_for_logical_date_less_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's arguments get the run's interval, the latest complete one for a run triggered
    without a logical date (the task's pre_execute fills it); the task has no template fields,
    so Airflow stores no rendered fields (a request to the API server per task)."""
    dag = dag_of(tmp_path, monkeypatch, {**ROW, "schedule": "@daily"})
    stage = dag.get_task("stage")
    assert not stage.template_fields

    def render(dag_run: SimpleNamespace) -> list[str]:
        context = {
            "dag_run": dag_run,
            "data_interval_start": dag_run.data_interval_start,
            "data_interval_end": dag_run.data_interval_end,
        }
        stage._pre_execute_hook(context)
        return list(stage.step_call(context).arguments)

    scheduled = SimpleNamespace(
        data_interval_start=datetime(2024, 3, 1, tzinfo=UTC),
        data_interval_end=datetime(2024, 3, 2, tzinfo=UTC),
        run_after=datetime(2024, 3, 2, tzinfo=UTC),
    )
    assert render(scheduled) == [
        "t",
        "--start",
        "2024-03-01T00:00:00+00:00",
        "--end",
        "2024-03-02T00:00:00+00:00",
    ]
    manual = SimpleNamespace(
        data_interval_start=None,
        data_interval_end=None,
        run_after=datetime(2024, 3, 5, 13, 30, tzinfo=UTC),
    )
    assert render(manual)[2:] == [
        "2024-03-04T00:00:00+00:00",
        "--end",
        "2024-03-05T00:00:00+00:00",
    ]
