"""The steps' metrics reach a real StatsD listener through Airflow's own Stats: the operator
runs stage and overwrite-final on a real Spark Connect server, without a scheduler."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cdc_airflow.local.connect_server import free_port
from cdc_airflow.local.launcher import connect_connection
from cdc_airflow.metrics import data_lag_seconds, step_metrics
from spark_jobs.status.freshness import DataFreshness
from tests.dags.test_connect_operator import ROW, context, operator
from tests.helpers import Workspace


class StatsdListener:
    """A UDP socket on 127.0.0.1 that Airflow's StatsD client sends to."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.port = int(self.socket.getsockname()[1])

    def received(self, quiet: float = 0.5) -> list[str]:
        """Every metric line that arrived, until none has for `quiet` seconds."""
        lines: list[str] = []
        self.socket.settimeout(quiet)
        while True:
            try:
                packet = self.socket.recv(65535)
            except TimeoutError:
                return lines
            lines.extend(packet.decode().splitlines())


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdListener]:
    """Airflow configured with StatsD on, at the listener; Stats initialized as the task runner
    does it (airflow.sdk.execution_time.task_runner.main), and back to no backend afterwards."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    listener = StatsdListener()
    with monkeypatch.context() as patch:
        patch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
        patch.setenv("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1")
        patch.setenv("AIRFLOW__METRICS__STATSD_PORT", str(listener.port))
        patch.setenv("AIRFLOW__METRICS__STATSD_PREFIX", "airflow")
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        try:
            yield listener
        finally:
            listener.socket.close()
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)


def without_durations(lines: list[str]) -> tuple[list[str], list[str]]:
    """The lines other than timers, and the timers' names (their values are wall times)."""
    timers = [line for line in lines if line.endswith("|ms")]
    for line in timers:
        assert re.fullmatch(r"[a-z_.]+:\d+\.\d{6}\|ms", line), line
    return [line for line in lines if line not in timers], [line.split(":")[0] for line in timers]


def test_each_step_sends_its_counts_freshness_and_duration_to_statsd(
    workspace: Workspace,
    connect_server: Any,
    statsd: StatsdListener,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workspace.configure(ROW)
    rows = [
        {"FLAG": "I", "ID": 1, "TS": "2024-01-01 00:10:00"},
        {"FLAG": "I", "ID": 2, "TS": "2024-01-01 00:20:00"},
        {"FLAG": "I", "ID": "not-a-number", "TS": "2024-01-01 00:30:00"},
    ]
    workspace.land("t", "2024-01-01T00", "a.csv", rows)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connect_connection(connect_server.port))

    staged = operator(workspace, "stage").execute(context())
    assert (staged["counts"]["staged"], staged["counts"]["quarantined"]) == (2, 1)
    lines, timers = without_durations(statsd.received())
    assert lines == [
        "airflow.cdc.stage.staged:2|c",
        "airflow.cdc.stage.staged.t:2|c",
        "airflow.cdc.stage.quarantined:1|c",
        "airflow.cdc.stage.quarantined.t:1|c",
    ]
    assert timers == ["airflow.cdc.stage.duration", "airflow.cdc.stage.duration.t"]

    applied = operator(workspace, "overwrite_final").execute(context())
    assert applied["counts"]["changes"] == 2
    lines, timers = without_durations(statsd.received())
    # Measured after the step: every landed file applied, nothing waits.
    assert lines == [
        "airflow.cdc.overwrite_final.changes:2|c",
        "airflow.cdc.overwrite_final.changes.t:2|c",
        f"airflow.cdc.overwrite_final.rows_written:{applied['counts']['rows_written']}|c",
        f"airflow.cdc.overwrite_final.rows_written.t:{applied['counts']['rows_written']}|c",
        "airflow.cdc.overwrite_final.files_waiting:0|g",
        "airflow.cdc.overwrite_final.files_waiting.t:0|g",
        "airflow.cdc.overwrite_final.data_lag_seconds:0|g",
        "airflow.cdc.overwrite_final.data_lag_seconds.t:0|g",
    ]
    assert timers == [
        "airflow.cdc.overwrite_final.duration",
        "airflow.cdc.overwrite_final.duration.t",
    ]

    # A try that fails (the server is down) counts a failure and nothing else.
    workspace.land("t", "2024-01-01T00", "b.csv", rows[:1])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connect_connection(free_port()))
    with pytest.raises(Exception, match="is not reachable"):
        operator(workspace, "stage").execute(context())
    assert statsd.received() == [
        "airflow.cdc.stage.failures:1|c",
        "airflow.cdc.stage.failures.t:1|c",
    ]


def test_a_kafka_tables_waiting_messages_and_the_oldest_waits_age_are_gauges() -> None:
    now = datetime(2024, 1, 1, 12, tzinfo=UTC)
    data = DataFreshness(
        table="k",
        measured_at=now,
        newest_change=None,
        newest_applied_file=None,
        files_applied=3,
        files_waiting=1,
        oldest_waiting=now - timedelta(minutes=5, seconds=0.4),
        files_outside_window=0,
        messages_waiting=42,
        partitions=2,
    )
    report = {"counts": {"changes": 7, "rows_written": 5}}
    assert [
        (m.what, m.kind, m.value) for m in step_metrics("overwrite_final", report, 1.5, data)
    ] == [
        ("changes", "counter", 7),
        ("rows_written", "counter", 5),
        ("files_waiting", "gauge", 1),
        ("messages_waiting", "gauge", 42),
        ("data_lag_seconds", "gauge", 300),
        ("duration", "timer", 1500.0),
    ]
    # Nothing applied and nothing waiting yet: no lag to tell.
    empty = DataFreshness("k", now, None, None, 0, 0, None, 0)
    assert data_lag_seconds(empty) is None
