"""Maintenance keeps data identical; a generated hostile stream matches the reference model."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from cdc_tools.generator import ORDERS_COLUMNS, ChangeSpec, generate_orders
from spark_jobs.optimize import run_optimize
from spark_jobs.vacuum import run_vacuum
from tests.helpers import Workspace, file_paths, table_rows
from tests.reference import landed_changes, latest_state
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

ORDERS = {
    "name": "orders",
    "file_format": "parquet",
    "columns": ORDERS_COLUMNS,
    "keys": ["ORDER_ID", "LINE_NO"],
    "sequence_by": ["CDC_TIMESTAMP"],
    "partition_expression": "year(to_date(CREATE_DATE, 'MM/dd/yyyy'))",
    "partition_column": "CREATE_DATE_YEAR",
    "zorder_by": ["CUSTOMER_ID"],
}
START = datetime(2024, 1, 1, tzinfo=UTC)
HOURS = 5
VALUE_COLUMNS = [
    "ORDER_ID",
    "LINE_NO",
    "CUSTOMER_ID",
    "CREATE_DATE",
    "AMOUNT",
    "STATUS",
    "CDC_TIMESTAMP",
]


def data_files_on_disk(table_path) -> set[str]:
    files = {p.relative_to(table_path).as_posix() for p in table_path.rglob("*.parquet")}
    return {f for f in files if not f.startswith("_delta_log/")}


def hour_text(offset: int) -> str:
    return (START + timedelta(hours=offset)).strftime("%Y-%m-%dT%H")


def expected_orders(workspace: Workspace) -> list[tuple]:
    state = latest_state(
        landed_changes(workspace.landing / "orders"),
        ["ORDER_ID", "LINE_NO"],
        lambda c: (c["CDC_TIMESTAMP"],),
    )
    return sorted(
        ((*tuple(r[c] for c in VALUE_COLUMNS), int(r["CREATE_DATE"][-4:])) for r in state.values()),
        key=repr,
    )


@pytest.fixture
def generated(spark, workspace: Workspace):
    table = workspace.configure(ORDERS)["orders"]
    spec = ChangeSpec(
        keys=300,
        lines_per_order=3,
        update_pct=20,
        delete_pct=5,
        insert_pct=10,
        duplicate_pct=5,
        late_pct=10,
        move_pct=20,
        files_per_hour=2,
    )
    generate_orders(spark, spec, workspace.landing / "orders", START, HOURS, "parquet")
    return table


def test_generated_stream_in_shuffled_order_matches_the_reference(
    spark, workspace: Workspace, generated
) -> None:
    order = list(range(HOURS))
    random.Random(4).shuffle(order)
    for hour in order:
        run(spark, workspace, generated, hour_text(hour), hour_text(hour + 1))
    expected = expected_orders(workspace)
    assert len(expected) > 300
    assert (
        table_rows(workspace.paths("orders").final, [*VALUE_COLUMNS, "CREATE_DATE_YEAR"])
        == expected
    )


def test_optimize_and_vacuum_keep_the_data_identical(
    spark, workspace: Workspace, generated
) -> None:
    paths = workspace.paths("orders")
    for hour in range(HOURS):
        run(spark, workspace, generated, hour_text(hour), hour_text(hour + 1))
    # One more interval run twice more leaves several files in the touched partitions.
    run(spark, workspace, generated, hour_text(0), hour_text(HOURS))
    before = table_rows(paths.final, [*VALUE_COLUMNS, "CREATE_DATE_YEAR"])
    files_before = file_paths(paths.final)
    report = run_optimize(context(spark, workspace, generated))
    assert report.counts["final_files_after"] <= report.counts["final_files_before"]
    assert table_rows(paths.final, [*VALUE_COLUMNS, "CREATE_DATE_YEAR"]) == before
    assert before == expected_orders(workspace)
    on_disk_before = len(data_files_on_disk(paths.final))
    vacuum = run_vacuum(context(None, workspace, generated), retention_hours=0, force=True)
    assert vacuum.counts["final_files_deleted"] > 0
    assert table_rows(paths.final, [*VALUE_COLUMNS, "CREATE_DATE_YEAR"]) == before
    on_disk_after = data_files_on_disk(paths.final)
    assert on_disk_after == file_paths(paths.final)
    assert len(on_disk_after) < on_disk_before
    assert files_before != file_paths(paths.final) or report.counts["partitions_optimized"] == 0
