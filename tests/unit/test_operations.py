"""Operations without Airflow running: durations, the manual run's interval, notifiers, the
quarantine check and the asset event's extra."""

from __future__ import annotations

import base64
import http.server
import json
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc_airflow import alerts
from cdc_airflow.alerts import (
    Alert,
    CdcNotifier,
    NotifierError,
    quarantine_finding,
    quarantine_reasons,
    send_alert,
    sender_for,
)
from cdc_airflow.operations import (
    FillRunInterval,
    PublishCounts,
    QuarantineBreach,
    QuarantineCheck,
    QuarantineLimitExceeded,
)
from cdc_pipeline.durations import format_duration, parse_duration
from cdc_pipeline.manual_runs import RunInterval, latest_complete_interval, run_interval
from cdc_pipeline.steps import QUARANTINE_BREACH_XCOM


def at(hour: int, minute: int = 0, day: int = 1) -> datetime:
    return datetime(2024, 1, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("45s", timedelta(seconds=45)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        (" 1D ", timedelta(days=1)),
        ("1w2d", timedelta(days=9)),
    ],
)
def test_durations_read_as_timedeltas_and_back(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2", "is not a duration such as"),
        ("2 hours", "is not a duration such as"),
        ("-1h", "is not a duration such as"),
        ("30m1h", "largest first"),
        ("1h1h", "largest first"),
        ("0m", "longer than zero"),
    ],
)
def test_bad_durations_say_what_is_expected(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_duration(text)


def test_format_duration_is_the_shortest_text() -> None:
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert format_duration(timedelta(days=2, seconds=5)) == "2d5s"


def test_a_run_without_interval_takes_the_latest_complete_interval_of_its_schedule() -> None:
    hourly, daily = "0 * * * *", "0 0 * * *"
    assert latest_complete_interval(hourly, at(1, 30)) == RunInterval(at(0), at(1))
    # A tick exactly at run_after closes the interval that ends there.
    assert latest_complete_interval(hourly, at(1)) == RunInterval(at(0), at(1))
    assert latest_complete_interval(daily, at(5, day=3)) == RunInterval(at(0, day=2), at(0, day=3))
    naive = datetime(2024, 1, 1, 1, 30)
    assert latest_complete_interval(hourly, naive) == RunInterval(at(0), at(1))


def test_a_run_keeps_its_own_interval_and_one_without_anything_is_refused() -> None:
    own = SimpleNamespace(data_interval_start=at(5), data_interval_end=at(6), run_after=at(9))
    assert run_interval("0 * * * *", own) == RunInterval(at(5), at(6))
    manual = SimpleNamespace(data_interval_start=None, data_interval_end=None, run_after=at(9, 5))
    assert run_interval("0 * * * *", manual) == RunInterval(at(8), at(9))
    nothing = SimpleNamespace(run_id="r1", data_interval_start=None, run_after=None)
    with pytest.raises(ValueError, match="run r1 has neither a data interval nor run_after"):
        run_interval("0 * * * *", nothing)


def test_fill_run_interval_gives_the_context_an_interval_only_when_it_has_none() -> None:
    context: dict[str, Any] = {
        "dag_run": SimpleNamespace(
            data_interval_start=None, data_interval_end=None, run_after=at(3, 10)
        )
    }
    FillRunInterval("0 * * * *")(context)
    assert (context["data_interval_start"], context["data_interval_end"]) == (at(2), at(3))
    scheduled = {"data_interval_start": at(7), "data_interval_end": at(8), "dag_run": None}
    FillRunInterval("0 * * * *")(scheduled)
    assert (scheduled["data_interval_start"], scheduled["data_interval_end"]) == (at(7), at(8))


def alert(**changes: Any) -> Alert:
    fields: dict[str, Any] = {
        "kind": "task_failed",
        "table": "t",
        "dag_id": "cdc_t",
        "run_id": "r1",
        "message": "boom",
        "task_id": "stage",
        **changes,
    }
    return Alert(**fields)


def test_the_registry_resolves_names_to_senders_and_says_what_is_wrong(tmp_path: Path) -> None:
    out = tmp_path / "a" / "alerts.jsonl"
    registry = {
        "record": {"kind": "jsonl", "path": str(out)},
        "nopath": {"kind": "jsonl"},
        "odd": {"kind": "pigeon"},
    }
    sender_for("record", registry)(alert())
    sender_for("record", registry)(alert(run_id="r2"))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r["run_id"], r["task_id"]) for r in lines] == [
        ("task_failed", "r1", "stage"),
        ("task_failed", "r2", "stage"),
    ]
    with pytest.raises(NotifierError, match=r"'ops' is not in the Airflow Variable cdc_notifiers"):
        sender_for("ops", registry)
    with pytest.raises(NotifierError, match=r"'nopath' \(kind jsonl\) needs path"):
        sender_for("nopath", registry)
    with pytest.raises(NotifierError, match=r"unknown kind 'pigeon' \(kinds: jsonl, smtp, webhook"):
        sender_for("odd", registry)


def test_a_webhook_posts_the_alert_with_the_connections_port_auth_and_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real HTTP server on a port of its own, behind basic auth: the connection's port,
    login/password and extra headers reach it, with the entry's endpoint and headers."""
    received: list[dict[str, Any]] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "headers": dict(self.headers), "body": body})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        connection = {
            "conn_type": "http",
            "host": "127.0.0.1",
            "schema": "http",
            "port": server.server_address[1],
            "login": "cdc",
            "password": "s3cret",
            "extra": {"X-Team": "data-eng"},
        }
        monkeypatch.setenv("AIRFLOW_CONN_OPS_WEBHOOK", json.dumps(connection))
        entry = {"kind": "webhook", "conn_id": "ops_webhook", "endpoint": "hooks/cdc"}
        sender_for("hook", {"hook": {**entry, "headers": {"X-Source": "cdc"}}})(alert())
    finally:
        server.shutdown()
        server.server_close()
    [request] = received
    assert request["path"] == "/hooks/cdc"
    assert request["headers"]["Authorization"] == "Basic " + base64.b64encode(b"cdc:s3cret").decode(
        "ascii"
    )
    assert request["headers"]["X-Team"] == "data-eng"
    assert request["headers"]["X-Source"] == "cdc"
    posted = json.loads(request["body"])
    assert (posted["kind"], posted["table"], posted["task_id"], posted["message"]) == (
        "task_failed",
        "t",
        "stage",
        "boom",
    )


def test_a_failing_notifier_is_reported_and_the_others_still_get_the_alert(tmp_path: Path) -> None:
    out = tmp_path / "alerts.jsonl"
    registry = {"record": {"kind": "jsonl", "path": str(out)}}
    assert send_alert(alert(), ["missing", "record"], registry) == ["missing"]
    assert len(out.read_text().splitlines()) == 1
    assert send_alert(alert(), [], registry) == []


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The registry Variable replaced by one `record` notifier writing to a file."""
    out = tmp_path / "recorded.jsonl"
    monkeypatch.setattr(
        alerts, "load_registry", lambda: {"record": {"kind": "jsonl", "path": str(out)}}
    )
    return out


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_failure_notifier_names_the_task_and_the_exception(recorded: Path) -> None:
    ti = SimpleNamespace(dag_id="cdc_t", run_id="r9", task_id="overwrite_final", try_number=3)
    CdcNotifier("t", ["record"])({"ti": ti, "exception": RuntimeError("no space left")})
    (record,) = records(recorded)
    assert (record["kind"], record["task_id"], record["run_id"]) == (
        "task_failed",
        "overwrite_final",
        "r9",
    )
    assert record["message"] == "RuntimeError: no space left"
    assert record["details"] == {"try_number": 3}


def test_the_deadline_callback_sends_a_deadline_alert(recorded: Path) -> None:
    context = {
        "dag_run": {"dag_id": "cdc_t", "dag_run_id": "r5", "state": "running"},
        "deadline": {"deadline_time": "2024-01-01T02:00:00+00:00"},
    }
    alerts.deadline_missed(context, table="t", notify=["record"], freshness="2h")
    (record,) = records(recorded)
    assert (record["kind"], record["run_id"]) == ("deadline_missed", "r5")
    assert record["message"] == (
        "table t: the run did not succeed within 2h of being queued "
        "(deadline 2024-01-01T02:00:00+00:00); its state is running"
    )


def stage_report(rows_read: int, quarantined: int, version: int | None = None) -> dict[str, Any]:
    counts: dict[str, Any] = {"rows_read": rows_read, "quarantined": quarantined}
    if version is not None:
        counts["quarantine_version"] = version
    return {"step": "stage", "table": "t", "counts": counts}


def test_quarantine_finding_compares_the_fraction_with_the_limit() -> None:
    assert quarantine_finding(stage_report(10, 1), 0.1).exceeded is False  # exactly the limit
    assert quarantine_finding(stage_report(10, 2), 0.1).fraction == 0.2
    assert quarantine_finding(stage_report(10, 2), 0.1).exceeded is True
    assert quarantine_finding(stage_report(0, 0), 0.0).exceeded is False
    assert quarantine_finding({"step": "stage", "line": "noop"}, 0.0).rows_read == 0
    assert quarantine_finding(None, 0.5).exceeded is False


def quarantine_table(path: Path) -> None:
    """Version 0: one old reason; version 1 (this run): 2 x null key, 1 x bad flag."""
    write_deltalake(str(path), pa.table({"ID": [7], "_cdc_reason": ["old reason"]}))
    write_deltalake(
        str(path),
        pa.table({"ID": [None, None, 3], "_cdc_reason": ["null key", "null key", "bad flag"]}),
        mode="append",
    )


def test_quarantine_reasons_are_those_of_the_runs_own_commit(tmp_path: Path) -> None:
    path = tmp_path / "quarantine"
    quarantine_table(path)
    assert quarantine_reasons(path, 1) == ["2 x null key", "1 x bad flag"]
    assert quarantine_reasons(path, 0) == ["1 x old reason"]


def test_quarantine_check_warns_or_fails_with_the_reasons(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    quarantine_table(tmp_path / "warehouse" / "t" / "quarantine")
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(
        dag_id="cdc_t",
        run_id="r1",
        task_id="stage",
        xcom_push=lambda key, value: pushed.update({key: value}),
    )
    QuarantineCheck("t", 0.5, "warn", ["record"])({"ti": ti}, stage_report(4, 2, 1))
    assert records(recorded) == [] and pushed == {}  # 2/4 is not more than 0.5
    QuarantineCheck("t", 0.25, "warn", ["record"])({"ti": ti}, stage_report(4, 3, 1))
    (warned,) = records(recorded)
    assert warned["kind"] == "quarantine"
    assert warned["message"] == (
        "table t: stage quarantined 3 of 4 rows (75.0%), more than max_quarantine_fraction "
        "0.25; reasons: 2 x null key; 1 x bad flag"
    )
    # warn: the run's check task will fail with the alert (operator.CdcStepOperator.execute).
    assert pushed == {QUARANTINE_BREACH_XCOM: warned["message"]}
    pushed.clear()
    with pytest.raises(QuarantineLimitExceeded, match=r"quarantined 3 of 4 rows .* 2 x null key"):
        QuarantineCheck("t", 0.25, "fail", ["record"])({"ti": ti}, stage_report(4, 3, 1))
    assert len(records(recorded)) == 2 and pushed == {}
    # The failure callback does not announce it a second time, nor the check task's failure.
    CdcNotifier("t", ["record"])({"ti": ti, "exception": QuarantineLimitExceeded("x")})
    CdcNotifier("t", ["record"])({"ti": ti, "exception": QuarantineBreach("x")})
    assert len(records(recorded)) == 2


def test_publish_counts_puts_the_interval_and_counts_on_the_asset_event() -> None:
    events: dict[str, SimpleNamespace] = {"asset": SimpleNamespace(extra={})}
    context = {
        "data_interval_start": at(0),
        "data_interval_end": at(1),
        "outlet_events": events,
    }
    report = {"step": "overwrite-final", "table": "t", "counts": {"rows_written": 2}}
    PublishCounts("asset")(context, report)
    assert events["asset"].extra == {
        "table": "t",
        "data_interval_start": "2024-01-01T00:00:00+00:00",
        "data_interval_end": "2024-01-01T01:00:00+00:00",
        "counts": {"rows_written": 2},
    }


def test_a_run_that_left_final_as_it_was_publishes_no_asset_event() -> None:
    task = SimpleNamespace(outlets=["asset"])
    events: dict[str, SimpleNamespace] = {"asset": SimpleNamespace(extra={})}
    context = {
        "data_interval_start": at(0),
        "data_interval_end": at(1),
        "outlet_events": events,
        "ti": SimpleNamespace(task=task),
    }
    noop = {"counts": {"changes": 0, "partitions_rewritten": 0, "rows_written": 0}}
    PublishCounts("asset")(context, noop)
    assert (task.outlets, events["asset"].extra) == ([], {})
    task.outlets = ["asset"]
    PublishCounts("asset")(context, {"counts": {"partitions_rewritten": 1, "rows_written": 0}})
    assert task.outlets == ["asset"]
    assert events["asset"].extra["counts"] == {"partitions_rewritten": 1, "rows_written": 0}


def test_files_outside_the_window_counted_by_a_stage_are_alerted(recorded: Path) -> None:
    ti = SimpleNamespace(dag_id="cdc_t", run_id="r1", task_id="stage")
    report = stage_report(4, 0, 0)
    QuarantineCheck("t", 0.5, "warn", ["record"])({"ti": ti}, report)
    assert records(recorded) == []
    report["counts"]["files_outside_window"] = 2
    QuarantineCheck("t", 0.5, "warn", ["record"])({"ti": ti}, report)
    (alert,) = records(recorded)
    assert (alert["kind"], alert["details"]) == (
        "files_outside_window",
        {"files_outside_window": 2},
    )
    assert alert["message"].startswith("table t: 2 file(s) landed in hour folders older than")


def test_a_file_waiting_longer_than_freshness_sends_a_stale_data_alert(
    recorded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tables.yaml"
    row = {
        "name": "t",
        "file_format": "csv",
        "columns": {"ID": "bigint", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "freshness": "1h",
    }
    config.write_text(json.dumps({"tables": [row]}))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_LANDING", str(tmp_path / "landing"))
    ti = SimpleNamespace(
        dag_id="cdc_t",
        run_id="r1",
        task_id="overwrite_final",
        task=SimpleNamespace(config_path=str(config), outlets=[]),
    )
    publish = PublishCounts("asset", "t", "1h", ("record",))
    events = {"asset": SimpleNamespace(extra={})}
    publish({"ti": ti, "outlet_events": events}, {"counts": {}})
    assert records(recorded) == []  # nothing landed: nothing waits
    now = datetime.now(UTC)
    folder = tmp_path / "landing" / "t" / f"dt={now:%Y-%m-%d}" / f"hr={now:%H}"
    folder.mkdir(parents=True)
    (folder / "a.csv").write_text("FLAG,ID,TS\nI,1,2024-01-01 00:00:00\n")
    publish({"ti": ti, "outlet_events": events}, {"counts": {}})
    assert records(recorded) == []  # it landed just now: within freshness
    two_hours_ago = now.timestamp() - 7200
    os.utime(folder / "a.csv", (two_hours_ago, two_hours_ago))
    publish({"ti": ti, "outlet_events": events}, {"counts": {}})
    (stale,) = records(recorded)
    assert stale["kind"] == "stale_data"
    assert stale["message"].startswith(
        "table t: 1 file(s) landed and not applied, the oldest since"
    )
    assert stale["details"]["files_waiting"] == 1


def test_the_registry_comes_from_the_variable_or_from_the_environment_in_a_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk import Variable

    stored = {"cdc_notifiers": '{"a": {"kind": "jsonl", "path": "/x"}}'}

    def get(key: str, default: Any = None) -> Any:
        return stored.get(key, default)

    monkeypatch.setattr(Variable, "get", staticmethod(get))
    assert alerts.load_registry() == {"a": {"kind": "jsonl", "path": "/x"}}
    stored.clear()
    assert alerts.load_registry() == {}

    def denied(key: str, default: Any = None) -> Any:
        raise PermissionError("Access denied for variable 'cdc_notifiers' by Execution API")

    monkeypatch.setattr(Variable, "get", staticmethod(denied))
    monkeypatch.setenv("AIRFLOW_VAR_CDC_NOTIFIERS", '{"b": {"kind": "jsonl", "path": "/y"}}')
    assert alerts.load_registry() == {"b": {"kind": "jsonl", "path": "/y"}}
    monkeypatch.setenv("AIRFLOW_VAR_CDC_NOTIFIERS", "")  # compose with CDC_NOTIFIERS unset
    assert alerts.load_registry() == {}
    monkeypatch.setattr(Variable, "get", staticmethod(lambda key, default=None: "[1]"))
    with pytest.raises(NotifierError, match="must be a JSON object"):
        alerts.load_registry()


def test_a_run_timeout_is_announced_and_other_run_failures_are_left_to_their_tasks(
    recorded: Path,
) -> None:
    from airflow.sdk import DAG

    notifier = alerts.CdcRunTimeoutNotifier("t", ["record"], "3h")
    dag = DAG("cdc_t", schedule=None)
    notifier({"dag": dag, "run_id": "r1", "reason": "task_failure"})
    assert records(recorded) == []
    notifier({"dag": dag, "run_id": "r2", "reason": "timed_out"})
    (record,) = records(recorded)
    assert (record["kind"], record["run_id"], record["task_id"]) == ("run_timed_out", "r2", None)
    assert record["message"] == (
        "table t: the run exceeded dagrun_timeout 3h; Airflow stopped its unfinished tasks"
    )


CONFIG_ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"execution_timeout": "2x"},
            "table t: execution_timeout: '2x' is not a duration such as 45s, 30m, 2h, 1h30m or 1d",
        ),
        (
            {"dagrun_timeout": "30m"},
            "table t: dagrun_timeout: 30m is shorter than execution_timeout 1h",
        ),
        ({"freshness": "1h1h"}, "table t: freshness: '1h1h': give each unit once, largest first"),
        ({"notify": ["Ops"]}, "table t: notify: notifier names must match ^[a-z][a-z0-9_]*$: Ops"),
        (
            {"quarantine_action": "stop"},
            "table t: quarantine_action: 'stop' is not one of warn, fail",
        ),
    ],
)
def test_bad_operations_fields_are_one_line_problems(fields: dict[str, Any], problem: str) -> None:
    from cdc_pipeline.config import parse_config

    problems = [str(p) for p in parse_config({"tables": [{**CONFIG_ROW, **fields}]}).problems]
    assert len(problems) == 1 and problems[0].startswith(problem), problems
