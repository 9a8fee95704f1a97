"""DAG parsing: one DAG per valid row, bad rows as an import error, parse cost, the planned shape."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from cdc_pipeline.config import load_table_configs
from cdc_pipeline.planning import is_due, plan_table_dag

DAGS = Path(__file__).resolve().parents[2] / "dags"
ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def dagbag(config: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CDC_CONFIG", str(config))
    return DagBag(dag_folder=str(DAGS))


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"tables": rows}))
    return path


def test_planned_dag_is_plain_data() -> None:
    table = load_table_configs(DAGS.parent / "config" / "tables.yaml").tables["orders"]
    plan = plan_table_dag(table)
    assert plan.dag_id == "cdc_orders"
    assert [t.task_id for t in plan.tasks] == [
        "stage",
        "overwrite_final",
        "reset_staging",
        "optimize",
        "vacuum",
        "check",
    ]
    assert plan.edges == (
        ("stage", "overwrite_final"),
        ("overwrite_final", "reset_staging"),
        ("reset_staging", "optimize"),
        ("optimize", "vacuum"),
        ("vacuum", "check"),
    )
    assert plan.tasks[0].arguments == (
        "orders",
        "--start",
        "<interval start>",
        "--end",
        "<interval end>",
    )
    assert [t.maintenance_schedule for t in plan.tasks if t.is_maintenance] == [
        "@weekly",
        "@daily",
        "@weekly",
        "@daily",
    ]
    assert plan.tags == ("cdc", "parquet", "upsert")
    assert '"partition_column": "CREATE_DATE_YEAR"' in plan.doc_md


def test_maintenance_is_due_when_its_cadence_fires_inside_the_interval() -> None:
    def at(hour: int, day: int = 1) -> datetime:
        return datetime(2024, 1, day, hour, tzinfo=UTC)

    assert is_due("@daily", at(0), at(1))
    assert not is_due("@daily", at(1), at(2))
    assert is_due("@daily", at(23), at(1, day=2))  # the next midnight is inside
    assert is_due("0 3 * * *", at(3), at(4))
    assert not is_due(None, at(0), at(1))
    assert is_due(
        "@weekly", datetime(2024, 1, 7, tzinfo=UTC), datetime(2024, 1, 7, 1, tzinfo=UTC)
    )  # a Sunday


def test_sample_config_loads_one_dag_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = dagbag(DAGS.parent / "config" / "tables.yaml", monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == [
        "cdc_accounts",
        "cdc_customers",
        "cdc_customers_cdc",
        "cdc_events",
        "cdc_orders",
    ]
    dag = bag.dags["cdc_orders"]
    assert sorted(t.task_id for t in dag.tasks) == [
        "check",
        "optimize",
        "overwrite_final",
        "reset_staging",
        "stage",
        "vacuum",
    ]
    assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"
    assert dag.timetable.expression == "0 * * * *"
    stage = dag.get_task("stage")
    assert stage.application.endswith("spark_jobs/stage.py")
    assert stage.application_args[0] == "orders"
    assert stage.conn_id == "spark_default"
    assert dag.get_task("optimize").trigger_rule == "none_failed"
    assert set(dag.tags) == {"cdc", "parquet", "upsert"}


def test_a_bad_row_is_an_import_error_and_hides_no_other_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [ROW, {**ROW, "name": "broken", "keys": ["NOPE"]}, {**ROW, "name": "also_ok"}]
    bag = dagbag(write(tmp_path, rows), monkeypatch)
    assert sorted(bag.dag_ids) == ["cdc_also_ok", "cdc_t"]
    assert list(bag.import_errors) == [str(DAGS / "cdc_config_errors.py")]
    error = next(iter(bag.import_errors.values()))
    assert "table broken: keys: 'NOPE' is not a declared column" in error


def test_200_rows_give_200_dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config table of 200 rows loads as 200 DAGs, without import errors."""
    rows = [{**ROW, "name": f"table_{i:03d}"} for i in range(200)]
    config = write(tmp_path, rows)
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CDC_CONFIG", str(config))
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == [f"cdc_table_{i:03d}" for i in range(200)]


def test_a_task_process_builds_only_its_own_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's task runner sets the parsing context; the file then builds that DAG alone."""
    rows = [{**ROW, "name": f"table_{i}"} for i in range(3)]
    config = write(tmp_path, rows)
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "cdc_table_1")
    from cdc_airflow.dags import build_dags

    assert list(build_dags(config)) == ["cdc_table_1"]
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID")
    assert list(build_dags(config)) == ["cdc_table_0", "cdc_table_1", "cdc_table_2"]


def test_overwrite_final_gates_every_maintenance_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """overwrite_final skips the maintenance tasks that are not due: it knows all of them, with
    their cadences, and they all run after it."""
    row = {**ROW, "optimize_schedule": "0 3 * * *", "vacuum_schedule": None}
    bag = dagbag(write(tmp_path, [row]), monkeypatch)
    dag = bag.dags["cdc_t"]
    gate = dag.get_task("overwrite_final")
    assert gate.maintenance_after == {
        "reset_staging": "@weekly",
        "optimize": "0 3 * * *",
        "vacuum": None,
        "check": "@daily",
    }
    assert set(gate.maintenance_after) <= gate.get_flat_relative_ids(upstream=False)
    for task_id in gate.maintenance_after:
        assert dag.get_task(task_id).maintenance_after == {}
    assert dag.get_task("stage").maintenance_after == {}


def test_every_task_of_a_parse_gets_the_jars_and_environment_worked_out_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jars folder and PySpark are located once a parse (cdc_airflow.dags.TaskSettings);
    every task still gets them, each in an environment of its own."""
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("b.jar", "a.jar", "notes.txt"):
        (jars / name).write_text("")
    monkeypatch.setenv("CDC_SPARK_JARS", str(jars))
    config = write(tmp_path, [{**ROW, "name": f"table_{i}"} for i in range(2)])
    from cdc_airflow.dags import build_dags

    tasks = [task for dag in build_dags(config).values() for task in dag.tasks]
    assert len(tasks) == 12
    assert {t.submit.jars for t in tasks} == {f"{jars / 'a.jar'},{jars / 'b.jar'}"}
    assert {t.submit.env_vars["CDC_CONFIG"] for t in tasks} == {str(config.resolve())}
    assert {t.config_path for t in tasks} == {str(config.resolve())}
    assert len({id(t.submit.env_vars) for t in tasks}) == 12  # one task's change stays its own


def test_the_serialized_dag_leaves_the_hooks_out_and_keeps_the_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the dag-processor stores of a task: no pre/post_execute hook's source text (the
    task process runs the hooks from the DAG file), the params exactly as Airflow serializes
    them, and a DAG the scheduler's side reads back with its trigger form's param."""
    from airflow.serialization.serialized_objects import DagSerialization

    from cdc_airflow.operator import CdcStepOperator

    row = {**ROW, "max_quarantine_fraction": 0.1}
    dag = dagbag(write(tmp_path, [row]), monkeypatch).dags["cdc_t"]
    stage = dag.get_task("stage")
    assert stage._pre_execute_hook is not None and stage._post_execute_hook is not None
    data = DagSerialization.to_dict(dag)
    tasks = {t["__var"]["task_id"]: t["__var"] for t in data["dag"]["tasks"]}
    assert len(tasks) == 6
    for task_id, task in tasks.items():
        assert not {"_pre_execute_hook", "_post_execute_hook"} & set(task)
        params = dag.get_task(task_id).params
        assert task["params"] == DagSerialization._serialize_params_dict(params)
    # Without the override, the same task but for the two hooks' source text.
    fields = CdcStepOperator.__dict__["get_serialized_fields"]
    try:
        del CdcStepOperator.get_serialized_fields
        plain = DagSerialization.to_dict(dag)
    finally:
        CdcStepOperator.get_serialized_fields = fields
    before = {t["__var"]["task_id"]: t["__var"] for t in plain["dag"]["tasks"]}
    assert "def __call__" in before["stage"]["_post_execute_hook"]
    for task_id, task in before.items():
        task.pop("_pre_execute_hook")
        task.pop("_post_execute_hook", None)
        assert task == tasks[task_id]
    read = DagSerialization.from_dict(data)
    assert read.params["force_maintenance"] is False
    assert read.get_task("overwrite_final").params["force_maintenance"] is False
