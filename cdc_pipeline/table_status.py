"""What the "CDC tables" view shows per table: Delta metadata and the last successful interval.

Reads only Delta logs (delta-rs) and the Airflow metadata DB: no table data, no Spark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.paths import TablePaths


@dataclass(frozen=True)
class TableStatus:
    """One row of the view."""

    name: str
    dag_id: str
    last_success_interval: str | None
    final_version: int | None
    final_rows: int | None
    staging_rows: int | None
    quarantined_rows: int | None
    last_optimize: str | None
    last_vacuum: str | None
    last_reset: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _table(path: Any) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def _rows(table: Any) -> int | None:
    if table is None:
        return None
    import pyarrow as pa

    counts = pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist()
    return int(sum(c or 0 for c in counts))


def _last(table: Any, match: Any) -> str | None:
    """Time of the newest commit (of the last 500) that `match` accepts."""
    if table is None:
        return None
    for entry in table.history(limit=500):
        if match(entry):
            return datetime.fromtimestamp(int(entry["timestamp"]) / 1000, UTC).strftime(
                "%Y-%m-%d %H:%M:%SZ"
            )
    return None


def last_success_intervals() -> dict[str, str]:
    """dag_id -> '[start, end)' of its latest successful run (Airflow metadata DB)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        latest = (
            select(DagRun.dag_id, func.max(DagRun.data_interval_end).label("end"))
            .where(DagRun.state == "success", DagRun.dag_id.like("cdc\\_%", escape="\\"))
            .group_by(DagRun.dag_id)
            .subquery()
        )
        rows = session.execute(
            select(DagRun.dag_id, DagRun.data_interval_start, DagRun.data_interval_end).join(
                latest,
                (DagRun.dag_id == latest.c.dag_id) & (DagRun.data_interval_end == latest.c.end),
            )
        ).all()
    return {
        dag_id: f"[{start:%Y-%m-%d %H:%M}, {end:%Y-%m-%d %H:%M})" for dag_id, start, end in rows
    }


def table_status(table: TableConfig, intervals: dict[str, str]) -> TableStatus:
    """The view's row of one table."""
    paths = TablePaths.for_table(table.name)
    final, staging, quarantine = (
        _table(paths.final),
        _table(paths.staging),
        _table(paths.quarantine),
    )
    return TableStatus(
        name=table.name,
        dag_id=table.dag_id,
        last_success_interval=intervals.get(table.dag_id),
        final_version=final.version() if final is not None else None,
        final_rows=_rows(final),
        staging_rows=_rows(staging),
        quarantined_rows=_rows(quarantine),
        last_optimize=_last(final, lambda e: e.get("operation") == "OPTIMIZE"),
        last_vacuum=_last(final, lambda e: e.get("operation") == "VACUUM END"),
        last_reset=_last(staging, lambda e: e.get("cdc_step") == "reset_staging"),
    )


def all_table_status(with_airflow: bool = True) -> list[TableStatus]:
    """One row per valid config row, sorted by name."""
    intervals = last_success_intervals() if with_airflow else {}
    return [table_status(t, intervals) for _, t in sorted(load_table_configs().tables.items())]
