"""The facts of a table's health as the tables show them (no Spark, no Airflow): freshness by
data, whether every table of it opens, the last `cdc check`, the last stage run's quarantine.
The state itself is decided in one place, `cdc_pipeline.health`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.columns import CHECK_FILE
from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import CdcError
from cdc_pipeline.health import Health, HealthFacts, table_health
from cdc_pipeline.paths import TablePaths
from cdc_pipeline.schedules import schedule_period
from spark_jobs import delta
from spark_jobs.runtime.storage import store_for
from spark_jobs.status.freshness import DataFreshness, data_freshness


def unreadable_table(paths: TablePaths) -> str | None:
    """The first of the table's Delta tables whose log cannot be read, and why (None: all open)."""
    for path in (paths.final, paths.staging, paths.ledger, paths.applied, paths.quarantine):
        try:
            delta.open_table(path)
        except CdcError as error:
            return str(error)
    return None


def check_breaches(paths: TablePaths) -> tuple[str, ...]:
    """The breaches the table's last `cdc check` found (none: passed, or never checked)."""
    path = paths.table_root / CHECK_FILE
    try:
        text = store_for(path).read_text(path)
        if text is None:
            return ()
        result = json.loads(text)
        return () if result.get("ok") else tuple(str(b) for b in result.get("breaches") or [])
    except (OSError, ValueError, AttributeError) as error:
        return (f"the check result {path} is unreadable ({error})",)


def last_quarantine_fraction(ledger: pa.Table | None) -> float | None:
    """The share of rows the newest stage run (the run of the newest ledger row) quarantined
    (None: no run read any row). Arrow columns: the ledger grows with every run."""
    if ledger is None or ledger.num_rows == 0 or "run_id" not in ledger.column_names:
        return None
    newest = pc.max(ledger["staged_at"]).as_py()
    at = 0 if newest is None else pc.index(ledger["staged_at"], newest).as_py()
    run = ledger["run_id"][at]
    same = pc.is_null(ledger["run_id"]) if not run.is_valid else pc.equal(ledger["run_id"], run)
    rows = ledger.filter(same)
    good = pc.sum(rows["rows_staged"]).as_py() or 0
    bad = pc.sum(rows["rows_quarantined"]).as_py() or 0
    return None if good + bad == 0 else bad / (good + bad)


def health_facts(
    table: TableConfig, paths: TablePaths, data: DataFreshness | None, unreadable: str | None
) -> HealthFacts:
    """What the tables say of `table` now (`data` None: its freshness could not be read)."""
    now = data.measured_at if data is not None else datetime.now(UTC)
    lag: timedelta | None = None
    if data is not None and data.oldest_change is not None:
        lag = max(timedelta(0), data.measured_at - data.oldest_change)
    fraction = None
    if unreadable is None:
        fraction = last_quarantine_fraction(delta.arrow_table(paths.ledger))
    return HealthFacts(
        period=schedule_period(table.schedule, now),
        freshness=table.freshness.delta if table.freshness else None,
        lag=lag,
        applied_anything=bool(data and data.files_applied),
        files_outside_window=data.files_outside_window if data is not None else 0,
        outside_apply_with=data.outside_files[0].apply_with
        if data is not None and data.outside_files
        else None,
        unreadable=unreadable,
        source_error=data.source_error if data is not None else None,
        check_breaches=check_breaches(paths),
        quarantine_fraction=fraction,
        max_quarantine_fraction=table.max_quarantine_fraction,
    )


def status_of(
    table: TableConfig, paths: TablePaths, now: datetime | None = None
) -> tuple[DataFreshness | None, Health]:
    """`cdc status` of one table: its freshness by data (None when a table cannot be read) and
    its health."""
    unreadable = unreadable_table(paths)
    data = None
    if unreadable is None:
        try:
            data = data_freshness(table, paths, now)
        except CdcError as error:
            unreadable = str(error)
    return data, table_health(health_facts(table, paths, data, unreadable))
