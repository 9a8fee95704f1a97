"""A step's numbers as Airflow metrics (StatsD or OpenTelemetry, as the deployment's `[metrics]`
says): rows staged, applied and quarantined, what waits, the data's lag, the step's duration.

Each metric is `cdc.<step>.<what>` with the table as the tag `table`; with Airflow's
`[metrics] legacy_names_on` (its default), each is sent a second time as
`cdc.<step>.<what>.<table>` for StatsD without tags, as Airflow's own metrics are
(`ti.finish` and `ti.finish.<dag_id>.<task_id>.<state>`). docs/operations.md lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from cdc_pipeline.counts import OverwriteCounts, StageCounts, count
from cdc_pipeline.steps import step_named

if TYPE_CHECKING:
    from spark_jobs.status.freshness import DataFreshness

log = logging.getLogger(__name__)

Kind = Literal["counter", "gauge", "timer"]


@dataclass(frozen=True)
class Metric:
    """One value of a step's run: a counter adds up over runs, a gauge is the latest state, a
    timer a duration in milliseconds."""

    what: str
    kind: Kind
    value: float


def counted(step: str, counts: Mapping[str, Any] | None) -> list[Metric]:
    """The rows a run moved, as counters: stage's staged and quarantined rows, overwrite-final's
    changes applied and rows written (0 when a no-op did not report them)."""
    if step == "stage":
        staged = StageCounts.of_payload(dict(counts or {}))
        return [
            Metric("staged", "counter", count(staged.staged)),
            Metric("quarantined", "counter", count(staged.quarantined)),
        ]
    if step == "overwrite_final":
        applied = OverwriteCounts.of_payload(dict(counts or {}))
        return [
            Metric("changes", "counter", count(applied.changes)),
            Metric("rows_written", "counter", count(applied.rows_written)),
        ]
    return []


def data_lag_seconds(data: DataFreshness) -> int | None:
    """How old the oldest change not applied is (its hour folder's start; 0: nothing waits and
    final has applied files; None: nothing applied or waiting yet), as the view's `behind`."""
    if data.oldest_change is not None:
        return max(0, round((data.measured_at - data.oldest_change).total_seconds()))
    return 0 if data.files_applied else None


def waiting(data: DataFreshness) -> list[Metric]:
    """Freshness by data as gauges: files (or a Kafka table's messages) waiting, the lag."""
    metrics = [Metric("files_waiting", "gauge", data.files_waiting)]
    if data.messages_waiting is not None:
        metrics.append(Metric("messages_waiting", "gauge", data.messages_waiting))
    lag = data_lag_seconds(data)
    if lag is not None:
        metrics.append(Metric("data_lag_seconds", "gauge", lag))
    return metrics


def step_metrics(
    step: str, report: Mapping[str, Any], seconds: float, data: DataFreshness | None = None
) -> list[Metric]:
    """A successful run's metrics: its counts, the freshness measured after it, its duration."""
    metrics = counted(step, report.get("counts"))
    if data is not None:
        metrics += waiting(data)
    return [*metrics, Metric("duration", "timer", seconds * 1000)]


def send(step: str, table: str, metrics: list[Metric]) -> None:
    """Send through Airflow's Stats (a no-op unless `[metrics]` turns a backend on)."""
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability.stats import Stats, normalize_name_for_stats

    legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
    suffix = normalize_name_for_stats(table)
    for metric in metrics:
        name = f"cdc.{step}.{metric.what}"
        names: list[tuple[str, dict[str, Any] | None]] = [(name, {"table": table})]
        if legacy:
            names.append((f"{name}.{suffix}", None))
        for stat, tags in names:
            if metric.kind == "counter":
                Stats.incr(stat, int(metric.value), tags=tags)
            elif metric.kind == "gauge":
                Stats.gauge(stat, metric.value, tags=tags)
            else:
                Stats.timing(stat, timedelta(milliseconds=metric.value), tags=tags)


def metrics_enabled() -> bool:
    """Whether `[metrics]` sends anywhere (StatsD, DogStatsD, OpenTelemetry): without a backend
    the freshness measurement behind the gauges (listings, a broker query) is not made."""
    from airflow.sdk.configuration import conf

    return any(
        conf.getboolean("metrics", option, fallback=False)
        for option in ("statsd_on", "statsd_datadog_enabled", "otel_on")
    )


def send_failure(step: str, table: str) -> None:
    """Count a failed try (`cdc.<step>.failures`); never hides the failure itself."""
    try:
        send(step, table, [Metric("failures", "counter", 1)])
    except Exception:
        log.exception("table %s: the failure metric of %s was not sent", table, step)


def measure_freshness(table: str, config_path: str | None) -> DataFreshness:
    """The table's freshness by data now (driver-side listings and Delta logs, no Spark)."""
    from cdc_pipeline.config import load_table_configs
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.status.freshness import data_freshness

    row = load_table_configs(config_path).table(table)
    return data_freshness(row, TablePaths.for_table(table))


def send_step_metrics(
    step: str, table: str, report: Mapping[str, Any], seconds: float, config_path: str | None
) -> DataFreshness | None:
    """Send a successful run's metrics; the step that writes final also measures the table's
    freshness by data (returned, for the stale-data alert). Never fails the task."""
    data = None
    if step_named(step).writes_final and metrics_enabled():
        try:
            data = measure_freshness(table, config_path)
        except Exception:  # the run's counts and duration are still sent
            log.exception("table %s: freshness by data unreadable", table)
    try:
        send(step, table, step_metrics(step, report, seconds, data))
    except Exception:
        log.exception("table %s: the metrics of %s were not sent", table, step)
    return data
