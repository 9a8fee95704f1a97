"""The step registry owns every per-step fact the CLI, the DAG planner and the Airflow layer use."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import parse_config
from cdc_pipeline.planning import plan_table_dag
from cdc_pipeline.steps import count_task_ids, dag_steps, step_named


def test_the_facts_of_each_step() -> None:
    assert [s.task_id for s in dag_steps()] == [
        "stage",
        "overwrite_final",
        "reset_staging",
        "optimize",
        "vacuum",
        "check",
    ]
    assert [s.task_id for s in dag_steps() if s.pooled] == [
        "overwrite_final",
        "reset_staging",
        "optimize",
        "vacuum",
    ]
    assert [s.task_id for s in dag_steps() if s.writes_final] == ["overwrite_final"]
    assert [s.task_id for s in dag_steps() if s.checks_quarantine] == ["stage"]
    assert count_task_ids() == ("stage", "overwrite_final")
    assert step_named("overwrite-final") is step_named("overwrite_final")
    assert not step_named("as-of").in_dag


def test_the_dag_plan_takes_pools_and_outlets_from_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_WAREHOUSE", "s3://lake/warehouse")
    row = {
        "name": "orders",
        "columns": {"ID": "bigint", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
    }
    plan = plan_table_dag(parse_config({"tables": [row]}).tables["orders"])
    assert {t.task_id: (t.pool, t.outlets) for t in plan.tasks} == {
        "stage": (None, ()),
        "overwrite_final": ("cdc_orders", ("s3://lake/warehouse/orders/final",)),
        "reset_staging": ("cdc_orders", ()),
        "optimize": ("cdc_orders", ()),
        "vacuum": ("cdc_orders", ()),
        "check": (None, ()),
    }
    # The asset of the table's final table: `cdc.<table>` at where final is.
    uri = "s3://lake/warehouse/orders/final"
    assert (plan.asset_name, plan.asset_uri) == (uri, uri)


def test_the_run_composite_orders_its_line_from_the_steps_counts() -> None:
    from cdc_pipeline.steps import RUN

    assert [step_named(name).module for name in RUN.steps] == ["stage", "overwrite_final"]
    stage = {"files": 2, "staging_version": 3, "rows_read": 5, "quarantine_version": 1, "x": 0}
    applied = {"partitions": 1, "rows_written": 4, "files": 9}
    counts = RUN.counts({"stage": stage, "overwrite-final": applied})
    # stage's listed keys it reported, every count of overwrite-final, stage's staging version.
    assert list(counts.items()) == [
        ("files", 9),
        ("rows_read", 5),
        ("partitions", 1),
        ("rows_written", 4),
        ("staging_version", 3),
    ]
