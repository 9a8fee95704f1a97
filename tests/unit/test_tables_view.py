"""The CDC tables view: freshness, run history, check results, per-DAG access, relative links, no docs."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pyarrow as pa
import pytest
import yaml
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from deltalake import write_deltalake
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cdc_airflow.view import plugin as view
from cdc_airflow.view import status as table_status
from cdc_airflow.view.runs import RunPoint, run_point
from cdc_airflow.view.status import freshness_of, read_check
from cdc_pipeline.config import load_table_configs
from cdc_pipeline.paths import TablePaths

NOW = datetime(2024, 3, 1, 12, 30, tzinfo=UTC)
PAGE = "/airflow/cdc-tables/"  # the view as the browser asks for it under a /airflow sub-path


def write_config(path: Path, freshness: dict[str, str | None]) -> None:
    rows = []
    for name, limit in freshness.items():
        row: dict[str, Any] = {
            "name": name,
            "file_format": "csv",
            "columns": {"ID": "bigint", "TS": "timestamp"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
            "start_date": "2024-03-01",
        }
        if limit is not None:
            row["freshness"] = limit
        rows.append(row)
    path.write_text(yaml.safe_dump({"tables": rows}))


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two hourly tables (alpha: freshness 2h, beta: none) in a private warehouse."""
    config = tmp_path / "tables.yaml"
    write_config(config, {"alpha": "2h", "beta": None})
    monkeypatch.setenv("CDC_CONFIG", str(config))
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_LANDING", str(tmp_path / "landing"))
    return tmp_path


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2024, 3, 1, hour, minute, tzinfo=UTC)


def test_freshness_is_hours_since_the_last_success_and_late_past_the_next_interval_plus_limit(
    tables: Path,
) -> None:
    alpha = load_table_configs().table("alpha")
    # Last success ended 10:00: the next interval ends 11:00 and must succeed by 11:00 + 2h.
    on_time = freshness_of(alpha, at(10), NOW)
    assert (on_time.hours_behind, on_time.deadline, on_time.overdue) == (2.5, at(13), False)
    late = freshness_of(alpha, at(10), at(13, 1))
    assert (late.deadline, late.overdue) == (at(13), True)
    # Never succeeded: the first interval (ending 01:00 on the start date) is the one due.
    never = freshness_of(alpha, None, NOW)
    assert (never.hours_behind, never.deadline, never.overdue) == (None, at(3), True)
    # No freshness: hours behind only, never late.
    beta = freshness_of(load_table_configs().table("beta"), at(1), NOW)
    assert (beta.hours_behind, beta.deadline, beta.overdue) == (11.5, None, False)


def test_run_point_reads_the_counts_from_the_steps_xcom_as_json_or_text() -> None:
    stage = {"step": "stage", "counts": {"files": 2, "rows_read": 7, "staged": 5, "quarantined": 2}}
    final = {"counts": {"changes": 5, "rows_written": 40, "partitions_rewritten": 3}}
    point = run_point(
        "r1",
        "success",
        interval=(at(9), at(10)),
        times=(datetime(2024, 3, 1, 10, 0, 5), datetime(2024, 3, 1, 10, 1, 35)),  # naive = UTC
        xcoms={"stage": json.dumps(stage), "overwrite_final": final},
    )
    started = datetime(2024, 3, 1, 10, 0, 5, tzinfo=UTC)
    assert point == RunPoint(
        "r1", "success", at(9), at(10), 90.0, 2, 7, 5, 2, 5, 40, 3, started=started
    )
    failed = run_point(
        "r2",
        "failed",
        interval=(at(10), at(11)),
        times=(at(11), None),
        xcoms={"stage": "not json"},
        failures=[("stage", "error: stage t: schema refused")],
    )
    assert failed == RunPoint(
        "r2",
        "failed",
        at(10),
        at(11),
        None,
        started=at(11),
        failures=(("stage", "error: stage t: schema refused"),),
    )
    # An interval without files: the steps report a no-op, which reads and stages nothing.
    noop = {"counts": {"noop": "true", "files": 0}}
    empty = run_point(
        "r3",
        "success",
        interval=(at(11), at(12)),
        times=(at(12), at(12, 1)),
        xcoms={"stage": noop},
    )
    assert empty == RunPoint("r3", "success", at(11), at(12), 60.0, 0, 0, 0, 0, started=at(12))


def test_read_check_gives_ok_the_first_breach_or_says_the_file_is_unreadable(
    tmp_path: Path,
) -> None:
    assert read_check(tmp_path) is None
    (tmp_path / "_cdc_check.json").write_text(
        json.dumps(
            {
                "checked_at": "2024-03-01T12:00:00Z",
                "ok": False,
                "breaches": ["final: key 3 twice", "staging: x"],
                "versions": {"final": 4},
            }
        )
    )
    check = read_check(tmp_path)
    assert check is not None
    assert (check.ok, check.first_breach, len(check.breaches)) == (False, "final: key 3 twice", 2)
    (tmp_path / "_cdc_check.json").write_text("{half")
    broken = read_check(tmp_path)
    assert broken is not None and not broken.ok
    assert broken.first_breach is not None and broken.first_breach.startswith("unreadable ")


def history() -> list[RunPoint]:
    """Three runs of alpha, oldest first: two successes and a failure between them."""
    return [
        RunPoint("scheduled__1", "success", at(7), at(8), 60.0, 1, 10, 10, 1, 10, 100, 2),
        RunPoint("scheduled__2", "failed", at(8), at(9), 30.0),
        RunPoint("scheduled__3", "success", at(9), at(10), 45.0, 1, 4, 3, 1, 3, 103, 1),
    ]


@pytest.fixture
def delta_tables(tables: Path) -> Path:
    """alpha's final (3 rows, then 1 more: version 1) and quarantine (2 rows); a failed check;
    a change file landed at 11:00 in hour 09's folder and not applied yet."""
    paths = TablePaths.for_table("alpha")
    waiting = paths.landing / "dt=2024-03-01" / "hr=09" / "late.csv"
    waiting.parent.mkdir(parents=True)
    waiting.write_bytes(b"x")
    os.utime(waiting, (at(11).timestamp(), at(11).timestamp()))
    write_deltalake(str(paths.final), pa.table({"ID": [1, 2, 3]}))
    write_deltalake(str(paths.final), pa.table({"ID": [4]}), mode="append")
    write_deltalake(str(paths.quarantine), pa.table({"_cdc_reason": ["a", "b"]}))
    (paths.table_root / "_cdc_check.json").write_text(
        json.dumps({"checked_at": "2024-03-01T12:00:00Z", "ok": False, "breaches": ["dup key 3"]})
    )
    return tables


def test_table_status_combines_runs_delta_logs_and_the_check(delta_tables: Path) -> None:
    alpha = load_table_configs().table("alpha")
    status = table_status.table_status(alpha, history(), NOW)
    assert status.last_run == history()[2]
    assert status.last_success_interval == "[2024-03-01 09:00, 2024-03-01 10:00)"
    # Behind by the data: the oldest change not applied is from hour 09's folder, 3.5 h old,
    # though its file landed at 11:00 (1.5 h ago): past the limit of 2h since 11:00.
    assert (status.freshness.hours_behind, status.freshness.overdue) == (3.5, True)
    assert status.freshness.deadline == at(11)
    assert status.freshness.data is not None
    assert status.freshness.data.oldest_waiting == at(11)
    assert (status.final_version, status.final_rows, status.quarantined_rows) == (1, 4, 2)
    assert status.staging_rows is None  # no staging table yet
    assert status.quarantine_growth == 2
    assert status.check is not None and status.check.first_breach == "dup key 3"
    data = status.as_dict()
    assert data["last_success_end"] == "2024-03-01T10:00:00+00:00"
    assert [r["seconds"] for r in data["runs"]] == [60.0, 30.0, 45.0]
    json.dumps(data)  # JSON-ready


def test_only_the_check_tasks_quarantine_breach_reads_as_a_warning(delta_tables: Path) -> None:
    """quarantine_action warn fails the check task to show the breach: the run applied its
    changes, so the table is not "last run failed". The same words from any other task are a
    failed run."""
    alpha = load_table_configs().table("alpha")
    breach = "quarantine limit exceeded: table alpha: stage quarantined 2 of 3 rows (66.7%)"

    def last(task: str) -> list[RunPoint]:
        failed = RunPoint("manual__4", "failed", at(10), at(11), 20.0, failures=((task, breach),))
        return [*history(), failed]

    check = table_status.table_status(alpha, last("check"), NOW)
    assert not any(r.startswith("last run failed") for r in check.health.reasons)
    stage = table_status.table_status(alpha, last("stage"), NOW)
    assert (stage.health.state, stage.health.reasons[0]) == (
        "error",
        f"last run failed: stage: {breach}",
    )


def test_sparkline_scales_values_into_the_box_and_marks_missing_ones() -> None:
    svg = view.sparkline([0.0, None, 10.0, 5.0], width=30, height=24)
    assert '<polyline points="0.0,22.0 20.0,2.0 30.0,12.0"/>' in svg
    assert '<rect class="failed" x="8.0" y="0" width="4" height="24"/>' in svg
    assert "<script" not in svg and "http" not in svg.replace("http://www.w3.org/2000/svg", "")
    assert view.sparkline([None, None]) == '<span class="muted">no runs</span>'


class DenyOneDag(SimpleAuthManager):
    """The simple auth manager, refusing one DAG: it cannot deny per DAG by itself (roles only)."""

    denied = "cdc_beta"

    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: DagDetails | None = None) -> bool:  # type: ignore[override]  # fmt: skip
        if details is not None and details.id == self.denied:
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )


def test_readable_dag_ids_asks_the_auth_manager_per_dag() -> None:
    dag_ids = {"cdc_alpha", "cdc_beta"}
    viewer = SimpleAuthManagerUser(username="v", role="viewer")
    no_role = SimpleAuthManagerUser(username="n", role=None)
    assert view.readable_dag_ids(SimpleAuthManager(), viewer, dag_ids) == dag_ids
    assert view.readable_dag_ids(SimpleAuthManager(), no_role, dag_ids) == set()
    assert view.readable_dag_ids(SimpleAuthManager(), None, dag_ids) == set()
    assert view.readable_dag_ids(DenyOneDag(), viewer, dag_ids) == {"cdc_alpha"}


@pytest.fixture
def client(delta_tables: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    """The plugin app mounted at /cdc-tables as Airflow mounts it, under a /airflow sub-path."""
    from airflow.api_fastapi import app as airflow_app

    monkeypatch.setattr(airflow_app._AuthManagerState, "instance", DenyOneDag())
    monkeypatch.setattr(
        table_status, "recent_runs", lambda dag_ids: {"cdc_alpha": history(), "cdc_beta": []}
    )
    monkeypatch.setattr(table_status, "paused_dags", lambda dag_ids: set())
    monkeypatch.setattr(table_status, "active_backfills", lambda dag_ids: {})
    monkeypatch.setattr(view, "utc_now", lambda: NOW)
    parent = FastAPI()
    parent.mount("/cdc-tables", view.app)
    return TestClient(parent, root_path="/airflow", follow_redirects=False)


def login(user: Any) -> None:
    view.app.dependency_overrides[view.current_user] = lambda: user


@pytest.fixture(autouse=True)
def no_login() -> Any:
    yield
    view.app.dependency_overrides.clear()


def test_the_page_shows_only_readable_tables_with_relative_links(client: TestClient) -> None:
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    response = client.get(f"{PAGE}")
    assert response.status_code == 200
    page = response.text
    assert 'id="table-alpha"' in page and 'id="table-beta"' not in page  # beta's DAG is denied
    assert 'href="/' not in page and "src=" not in page and "<script" not in page
    base = "http://testserver/airflow/cdc-tables/"
    assert urljoin(base, "../dags/cdc_alpha") == "http://testserver/airflow/dags/cdc_alpha"
    assert 'href="../dags/cdc_alpha"' in page
    assert 'href="../dags/cdc_alpha/runs/scheduled__3"' in page
    assert (
        "3.5 h behind: 1 file(s) waiting, changes from 2024-03-01 09:00Z on (limit 2h)<br>"
        "past deadline 2024-03-01 11:00Z"
    ) in page
    assert "1 failed" in page
    assert "+2 over 3 runs, 2 held" in page  # quarantine growth and rows held
    assert "breach</span>: dup key 3" in page
    assert (
        "files 1, read 4, staged 3, quarantined 1, changes 3, written 103, partitions 1 in 45 s"
        in page
    )
    assert page.count('<svg class="spark"') == 3
    data = client.get(f"{PAGE}api/tables").json()
    assert [t["name"] for t in data] == ["alpha"]


def test_a_table_with_a_damaged_log_gets_its_row_and_the_others_still_show(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(view, "readable_dag_ids", lambda *_: {"cdc_alpha", "cdc_beta"})
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    staging = TablePaths.for_table("alpha").staging / "_delta_log"
    staging.mkdir(parents=True)
    (staging / "00000000000000000000.json").write_text('{"commitInfo": {')
    response = client.get(f"{PAGE}")
    assert response.status_code == 200
    page = response.text
    assert 'id="table-alpha"' in page and 'id="table-beta"' in page
    row = page[page.index('id="table-alpha"') : page.index('id="table-beta"')]
    assert "staging unreadable: DeltaError: Kernel error: Json error" in row


def test_a_user_without_a_role_sees_no_table(client: TestClient) -> None:
    login(SimpleAuthManagerUser(username="n", role=None))
    assert "No table you may read." in client.get(f"{PAGE}").text
    assert client.get(f"{PAGE}api/tables").json() == []


def test_a_late_table_is_red(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    monkeypatch.setattr(view, "utc_now", lambda: at(13, 1))
    page = client.get(f"{PAGE}").text
    row = page[page.index('id="table-alpha"') :]
    # The file waiting since 11:00 holds changes of hour 09: due by 11:00 (freshness 2h).
    cells = row.split("<td", 4)
    assert cells[3].startswith(' class="late"')
    assert "past deadline 2024-03-01 11:00Z" in row
    # The one health state says the same, with the reason, and so does the header.
    assert cells[1].startswith(' class="health"><span class="health error">error</span>')
    assert "<li>4.0 h behind (error after 2.0 h)</li>" in cells[1]
    assert "tables: 1 error, " in page


def test_without_login_the_page_redirects_relatively_and_the_json_is_refused(
    client: TestClient,
) -> None:
    response = client.get(f"{PAGE}")
    assert response.status_code == 307
    location = response.headers["location"]
    assert location.startswith("../api/v2/auth/login?next=")
    assert urljoin("http://testserver/airflow/cdc-tables/", location).startswith(
        "http://testserver/airflow/api/v2/auth/login?next="
    )
    assert client.get(f"{PAGE}api/tables").status_code == 401


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_the_plugin_serves_no_api_docs(client: TestClient, path: str) -> None:
    assert client.get(f"{PAGE}api/tables").status_code == 401  # the app answers at this prefix
    assert client.get(f"{PAGE}{path.lstrip('/')}").status_code == 404


def test_the_quarantine_drill_down_is_linked_and_per_dag_like_the_page(
    client: TestClient,
) -> None:
    """alpha's quarantine (2 rows, reason column only: an older table) behind the same login
    and per-DAG access as the page; beta's DAG is denied, so its page is a 404 like no table."""
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    page = client.get(f"{PAGE}").text
    assert '<a class="muted" href="quarantine/alpha">rows and sources</a>' in page
    drill = client.get(f"{PAGE}quarantine/alpha")
    assert drill.status_code == 200
    assert '<p id="quarantine-total">2 rows held.</p>' in drill.text
    assert "<tr><td>a</td><td class='num'>1</td></tr>" in drill.text
    assert 'href="../../cdc-tables/"' in drill.text  # back to the page, relative
    assert client.get(f"{PAGE}quarantine/beta").status_code == 404
    assert client.get(f"{PAGE}quarantine/nope").status_code == 404
    view.app.dependency_overrides.clear()
    redirected = client.get(f"{PAGE}quarantine/alpha")
    assert redirected.status_code == 307
    assert redirected.headers["location"].startswith("../../api/v2/auth/login?next=")


def test_the_drill_down_shows_sources_and_escapes_the_values() -> None:
    from spark_jobs.status.quarantine import QuarantinedRow, QuarantineReport

    sample = QuarantinedRow(
        batch="2024-03-01T09",
        file="late.csv",
        row=4,
        reason="null key column ID",
        values={"ID": None, "NAME": "<script>x</script>"},
    )
    report = QuarantineReport(
        table="alpha",
        total=1,
        counts=[("2024-03-01T09", "null key column ID", 1)],
        samples=[sample],
        batches_read=1,
    )
    body = view.render_quarantine(report, "../../")
    assert "<script>" not in body
    assert (
        "<tr><td>2024-03-01T09</td><td>late.csv</td><td class='num'>4</td>"
        "<td>null key column ID</td><td><code>ID=null, NAME=&#x27;&lt;script&gt;x&lt;/script&gt;"
        "&#x27;</code></td></tr>"
    ) in body


def test_handlers_that_read_files_and_the_db_run_in_the_thread_pool() -> None:
    # FastAPI runs a plain `def` endpoint in its thread pool: delta-rs and the metadata DB
    # never block the api-server's event loop. Only the login check (a token decode) is async.
    import inspect

    assert not inspect.iscoroutinefunction(view.tables_page)
    assert not inspect.iscoroutinefunction(view.tables_json)
    assert not inspect.iscoroutinefunction(view.quarantine_page)


def test_the_last_run_whatever_its_state_paused_dags_and_a_quarantine_rate_past_its_limit(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an on-call engineer needs first: the run that failed (its task, reason and log),
    the run going on now, a paused DAG, quarantine as a rate against the row's limit."""
    failed = RunPoint(
        "manual__4",
        "failed",
        at(10),
        at(11),
        20.0,
        1,
        5,
        2,
        3,
        started=at(11, 2),
        failures=(("overwrite_final", "error: overwrite-final alpha: TableDamagedError: x"),),
    )
    running = RunPoint("scheduled__5", "running", at(11), at(12), None, started=at(12, 1))
    runs = {"cdc_alpha": [*history(), failed], "cdc_beta": [*history(), running]}
    monkeypatch.setattr(table_status, "recent_runs", lambda dag_ids: runs)
    monkeypatch.setattr(table_status, "paused_dags", lambda dag_ids: {"cdc_beta"})
    monkeypatch.setattr(view, "readable_dag_ids", lambda *_: {"cdc_alpha", "cdc_beta"})
    config = Path(os.environ["CDC_CONFIG"])
    rows = yaml.safe_load(config.read_text())["tables"]
    rows[0]["max_quarantine_fraction"] = 0.05
    config.write_text(yaml.safe_dump({"tables": rows}))
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    page = client.get(PAGE).text
    assert '<meta http-equiv="refresh" content="60">' in page
    alpha = page[page.index('id="table-alpha"') : page.index('id="table-beta"')]
    beta = page[page.index('id="table-beta"') :]
    last_alpha = alpha.split('class="last-run">')[1].split("</td>")[0]
    assert last_alpha == (
        '<span class="state failed">failed</span> '
        '<a href="../dags/cdc_alpha/runs/manual__4" target="_top">2024-03-01 11:02Z</a><br>'
        "files 1, read 5, staged 2, quarantined 3 in 20 s<br>"
        '<a class="bad" href="../dags/cdc_alpha/runs/manual__4/tasks/overwrite_final" '
        'target="_top">overwrite_final</a>: error: overwrite-final alpha: TableDamagedError: x'
    )
    # 5 of the 19 rows read over the 3 finished runs with counts: 26.3%, past 5%: red.
    assert '<span class="over">26.3% of rows read (limit 5.0%)</span>' in alpha
    assert "2 failed" in alpha and "paused" not in alpha.split("</td>")[1]
    assert '<span class="state paused">paused</span>' in beta.split("</td>")[1]
    # Alpha's last finished run failed: its health is error, naming the task and the reason.
    assert (
        '<span class="health error">error</span><ul class="reasons"><li>last run failed: '
        "overwrite_final: error: overwrite-final alpha: TableDamagedError: x</li>"
    ) in alpha
    assert '<span class="state running">running</span>' in beta
    # Beta's sparklines hold its 3 finished runs, not the running one.
    assert "over 3 runs" in beta
    # One date format in the page: the check's ISO time too.
    assert "2024-03-01 12:00Z" in alpha and "T12:00:00" not in page


def test_top_quarantine_reasons_leave_out_the_values_and_final_commits_form_a_timeline(
    tables: Path,
) -> None:
    """The quarantine's reasons counted by cause (its quoted value left out), most frequent
    first; final's newest commits with the step, files added and removed, rows added and the
    attempt's time from its run id to the commit."""
    from datetime import timedelta

    from deltalake import CommitProperties

    paths = TablePaths.for_table("alpha")
    reasons = [
        "unparsable value in AMOUNT: 'x1' is not a valid decimal(10,2)",
        "unparsable value in AMOUNT: 'it's' is not a valid decimal(10,2)",
        "null key column ID",
        "unparsable value in AMOUNT: '' is not a valid decimal(10,2)",
        "unknown flag in FLAG: 'Q' (expected I, U or D)",
        "null key column ID",
    ]
    write_deltalake(str(paths.quarantine), pa.table({"_cdc_reason": reasons[:3]}))
    write_deltalake(str(paths.quarantine), pa.table({"_cdc_reason": reasons[3:]}), mode="append")
    write_deltalake(str(paths.final), pa.table({"ID": [1, 2, 3]}))
    started = datetime.now(UTC) - timedelta(seconds=3)
    step = {"cdc_step": "overwrite_final", "cdc_run_id": f"{started:%Y%m%dT%H%M%S}-0123456789ab"}
    write_deltalake(
        str(paths.final),
        pa.table({"ID": [4, 5]}),
        mode="overwrite",
        commit_properties=CommitProperties(custom_metadata=step),
    )
    alpha = load_table_configs().table("alpha")
    status = table_status.table_status(alpha, history(), NOW)
    assert status.problem is None
    assert status.top_reasons == [
        ("unparsable value in AMOUNT: '…' is not a valid decimal(10,2)", 3),
        ("null key column ID", 2),
        ("unknown flag in FLAG: '…' (expected I, U or D)", 1),
    ]
    newest, first = status.commits
    assert (newest.version, newest.operation) == (1, "overwrite_final")
    assert (newest.files_added, newest.files_removed, newest.rows_added) == (1, 1, 2)
    assert newest.seconds is not None and 2 <= newest.seconds <= 60
    assert (first.version, first.operation, first.files_added, first.rows_added) == (
        0,
        "WRITE",
        1,
        3,
    )
    assert first.seconds is None  # no run id: not a step's commit
    row = view.render_row(status, "../")
    assert "3 rows: unparsable value in AMOUNT: &#x27;…&#x27; is not a valid decimal(10,2)" in row
    assert "<li>v1 " in row and " overwrite_final, +1 -1 files, 2 rows, " in row
    assert row.index("<li>v1 ") < row.index("<li>v0 ")  # newest first
    data = status.as_dict()
    assert data["top_reasons"][0] == {
        "reason": "unparsable value in AMOUNT: '…' is not a valid decimal(10,2)",
        "rows": 3,
    }
    assert [c["version"] for c in data["commits"]] == [1, 0]
    json.dumps(data)


def test_the_attempts_timeline_shows_queued_running_and_failed_tries_and_backfill_progress(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Newest first: the backfill's progress (n of m runs done), its queued runs as one line,
    the task running with its try and time, the task that failed after its retries; a table
    without runs says so. The JSON API carries the same attempts and backfills."""
    from datetime import timedelta

    from cdc_airflow.view.runs import Attempt, BackfillProgress

    def backfill_run(hour: int, state: str, *attempts: Attempt) -> RunPoint:
        return RunPoint(
            f"backfill__{hour:02d}",
            state,
            at(hour),
            at(hour + 1),
            42.0 if state == "success" else None,
            started=at(11, hour),
            run_type="backfill",
            backfill_id=7,
            attempts=attempts,
        )

    running = Attempt(
        task_id="overwrite_final",
        state="running",
        try_number=2,
        tries=3,
        started=NOW - timedelta(seconds=80),
    )
    failed = Attempt(task_id="stage", state="failed", try_number=3, tries=3, reason="error: x")
    runs = [
        *history(),
        backfill_run(1, "success"),
        backfill_run(2, "failed", failed),
        backfill_run(3, "running", running),
        *(backfill_run(h, "queued") for h in (4, 5, 6, 7, 8)),
    ]
    progress = BackfillProgress(
        backfill_id=7,
        from_date=at(1),
        to_date=at(8),
        states={"success": 1, "failed": 1, "running": 1, "queued": 5},
        skipped=1,
    )
    monkeypatch.setattr(table_status, "recent_runs", lambda dag_ids: {"cdc_alpha": runs})
    monkeypatch.setattr(table_status, "active_backfills", lambda dag_ids: {"cdc_alpha": [progress]})
    monkeypatch.setattr(view, "readable_dag_ids", lambda *_: {"cdc_alpha", "cdc_beta"})
    login(SimpleAuthManagerUser(username="v", role="viewer"))
    page = client.get(PAGE).text
    assert "<th>Attempts (newest first)</th>" in page
    alpha = page[page.index('id="table-alpha"') : page.index('id="table-beta"')]
    cell = alpha.split('<td class="attempts">')[1].split("</td>")[0]
    lines = [line.split("</li>")[0] for line in cell.split("<li")[1:]]
    assert lines[0] == (
        ' class="backfill"><b>backfill 2 of 8 runs done: 1 failed, 1 running, 5 queued, '
        '1 date skipped</b><br><span class="muted">dates 2024-03-01 01:00Z to '
        "2024-03-01 08:00Z</span>"
    )
    assert lines[1] == (
        '><span class="state queued">queued</span> 5 backfill runs, next [2024-03-01 04:00, 05:00)'
    )
    run = "../dags/cdc_alpha/runs/backfill__"
    assert lines[2] == (
        f'><span class="state running">running</span> <a href="{run}03" target="_top">'
        "backfill [2024-03-01 03:00, 04:00)</a><br>"
        f'<a href="{run}03/tasks/overwrite_final?try_number=2" target="_top">'
        "overwrite_final try 2 of 3, running 1m20s</a>"
    )
    assert lines[3] == (
        f'><span class="state failed">failed</span> <a href="{run}02" target="_top">'
        "backfill [2024-03-01 02:00, 03:00)</a><br>"
        f'<a class="bad" href="{run}02/tasks/stage?try_number=3" target="_top">'
        "stage failed after 3 tries</a>"
    )
    assert lines[4].endswith("backfill [2024-03-01 01:00, 02:00)</a><br>in 42 s")
    assert lines[5].endswith(">run [2024-03-01 09:00, 10:00)</a><br>in 45 s")  # type unknown
    assert len(lines) == 2 + 5  # the backfill, the queued line, the 5 newest other runs
    beta = page[page.index('id="table-beta"') :]
    assert '<td class="attempts"><span class="muted">no runs yet</span></td>' in beta
    data = {t["name"]: t for t in client.get(f"{PAGE}api/tables").json()}
    assert data["alpha"]["backfills"][0]["summary"] == "2 of 8 runs done"
    assert data["alpha"]["last_run"]["run_type"] == "backfill"
    (attempt,) = data["alpha"]["runs"][5]["attempts"]
    assert (attempt["task_id"], attempt["try_number"], attempt["tries"]) == (
        "overwrite_final",
        2,
        3,
    )
    assert (data["beta"]["runs"], data["beta"]["backfills"]) == ([], [])


@pytest.mark.parametrize(
    ("state", "tried", "started", "text"),
    [
        ("failed", 1, None, "stage failed after 1 try"),
        ("failed", 1, 3, "stage failed at try 1 of 3, not retried"),
        ("up_for_retry", 1, 3, "stage try 1 of 3 failed, retrying"),
        ("queued", 2, 3, "stage queued, try 2 of 3"),
        ("running", 1, 1, "stage try 1 of 1, running 2h05m"),
        ("deferred", 1, 1, "stage try 1 of 1, deferred 2h05m"),
    ],
)
def test_an_attempt_reads_as_its_task_its_try_and_what_it_does(
    state: str, tried: int, started: int | None, text: str
) -> None:
    from datetime import timedelta

    from cdc_airflow.view.runs import Attempt

    attempt = Attempt(
        task_id="stage",
        state=state,
        try_number=tried,
        tries=started or tried,
        started=None if state in ("queued", "failed") else NOW - timedelta(minutes=125),
    )
    assert view.attempt_text(attempt, NOW) == text
