"""Airflow for real: dags test, a scheduler-run overlapping backfill, a REST-triggered run, a Spark cluster.

The launcher's default is Spark Connect mode (spark_default is a `spark_connect` connection to
its local server): dags test, the backfill and the REST run use it; the cluster test uses a
`spark` connection, i.e. spark-submit.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from cdc_airflow.local.launcher import connect_connection
from cdc_pipeline.paths import ObjectPath
from cdc_tools.demo import queue_backfill
from spark_jobs.runtime.storage import store_for
from tests.e2e.airflow_env import BIN, AirflowEnv, free_port
from tests.e2e.browser import artifacts_folder, chromium
from tests.helpers import Workspace, table_rows

pytestmark = pytest.mark.slow


def row(name: str) -> dict:
    return {
        "name": name,
        "file_format": "csv",
        "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "optimize_schedule": "@daily",
        "vacuum_schedule": None,
        "reset_staging_schedule": None,
        "start_date": "2024-01-01",
    }


TABLES = ["t_dagtest", "t_backfill", "t_rest", "t_cluster", "t_s3"]


def land_hours(ws: Workspace, table: str, hours: int) -> list[tuple[int, int]]:
    """Each hour h updates key 1 to h and inserts key h+10; returns the expected final rows."""
    for h in range(hours):
        ws.land(
            table,
            f"2024-01-01T{h:02d}",
            "a.csv",
            [
                {"FLAG": "U" if h else "I", "ID": 1, "VALUE": h, "TS": f"2024-01-01 {h:02d}:00:01"},
                {"FLAG": "I", "ID": 10 + h, "VALUE": h, "TS": f"2024-01-01 {h:02d}:00:02"},
            ],
        )
    return sorted([(1, hours - 1)] + [(10 + h, h) for h in range(hours)])


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowEnv, Workspace]]:
    root = tmp_path_factory.mktemp("airflow")
    ws = Workspace(root)
    ws.config_path.write_text(yaml.safe_dump({"tables": [row(t) for t in TABLES]}))
    env = AirflowEnv(root / "airflow_home", ws.config_path, ws.landing, ws.warehouse, log_dir=root)
    env.migrate()
    try:
        env.start_spark()  # the local Spark Connect server (also for `dags test`)
        yield env, ws
    finally:
        env.stop()


def test_dags_test_runs_one_interval(airflow: tuple[AirflowEnv, Workspace]) -> None:
    env, ws = airflow
    expected = land_hours(ws, "t_dagtest", 1)
    # A manual run at X covers the interval that ends at X: here [00:00, 01:00).
    started = time.monotonic()
    result = env.airflow("dags", "test", "cdc_t_dagtest", "2024-01-01T01:00:00+00:00")
    print(f"\ndags test of one hour in Connect mode: {time.monotonic() - started:.1f} s")
    output = result.stdout + result.stderr
    # The steps ran in the task process as Connect clients: no spark-submit, the summary logged.
    assert "Spark-Submit cmd" not in output
    assert "CDC summary: stage t_dagtest [2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z): " in output
    assert table_rows(ws.paths("t_dagtest").final, ["ID", "VALUE"]) == expected
    (run,) = env.runs("cdc_t_dagtest")
    assert env.task_states("cdc_t_dagtest", run["run_id"]) == {
        "stage": "success",
        "overwrite_final": "success",
        "reset_staging": "skipped",
        "optimize": "success",
        "vacuum": "skipped",
        "check": "success",
    }


def test_an_interval_without_change_files_is_a_noop_without_spark(
    airflow: tuple[AirflowEnv, Workspace],
) -> None:
    env, ws = airflow
    # Hour 00 of Jan 1 only, applied by the test above: the interval [Jan 5 05:00, 06:00) and
    # its 3-day late-arrival window hold no file.
    land_hours(ws, "t_dagtest", 1)
    # spark_default points at a port nobody listens on: any Spark use would fail the task.
    no_spark = AirflowEnv(
        env.home,
        env.config,
        env.landing,
        env.warehouse,
        spark_connection=connect_connection(free_port()),
        port=env.port,
    )
    result = no_spark.airflow("dags", "test", "cdc_t_dagtest", "2024-01-05T06:00:00+00:00")
    output = result.stdout + result.stderr
    window = "[2024-01-05T05:00:00Z, 2024-01-05T06:00:00Z)"
    assert f"CDC summary: stage t_dagtest {window}: noop=true files=0" in output
    assert f"CDC summary: overwrite-final t_dagtest {window}: noop=true files=0" in output
    run = next(
        r for r in no_spark.runs("cdc_t_dagtest") if r["logical_date"].startswith("2024-01-05T06")
    )
    states = no_spark.task_states("cdc_t_dagtest", run["run_id"])
    assert (states["stage"], states["overwrite_final"]) == ("success", "success")


# Before any test starts the scheduler's services: with a dag-processor parsing the DAG file with
# the module's local warehouse, the table's asset (named by the final table's location) would
# switch back between its local and its bucket location under this test's `dags test` runs, and
# a task whose outlet went inactive fails (AirflowInactiveAssetInInletOrOutletException, seen
# in CI and in a full run here).
def test_a_dag_runs_with_landing_and_warehouse_on_object_storage(
    airflow: tuple[AirflowEnv, Workspace], s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One table's DAG in Connect mode (the shared warm server) with CDC_LANDING and
    CDC_WAREHOUSE in a bucket of a real S3 server: stage, overwrite-final, optimize and check
    (its result file written to the bucket) run in the task process as they do on local folders.
    Airflow has no AWS variable: endpoint, keys and region come from its connection
    `cdc_object_store`."""
    env, local = airflow
    aws = s3_server.environment()
    for name, value in aws.items():
        monkeypatch.setenv(name, value)  # this test's own reads and writes
    ws = Workspace(local.root, ObjectPath(s3_server.create_bucket()))
    expected = land_hours(ws, "t_s3", 2)
    connection = {
        "conn_type": "aws",
        "login": aws["AWS_ACCESS_KEY_ID"],
        "password": aws["AWS_SECRET_ACCESS_KEY"],
        "extra": {"endpoint_url": aws["AWS_ENDPOINT_URL"], "region_name": aws["AWS_REGION"]},
    }
    for name in aws:
        monkeypatch.delenv(name)  # Airflow (started below) gets none of them
    monkeypatch.setenv("AIRFLOW_CONN_CDC_OBJECT_STORE", json.dumps(connection))
    s3_env = AirflowEnv(
        env.home,
        env.config,
        ws.landing,
        ws.warehouse,
        spark_connection=env.spark_default,
        port=env.port,
    )
    for hour in (1, 2):
        result = s3_env.airflow("dags", "test", "cdc_t_s3", f"2024-01-01T0{hour}:00:00+00:00")
        window = f"[2024-01-01T0{hour - 1}:00:00Z, 2024-01-01T0{hour}:00:00Z)"
        assert f"CDC summary: stage t_s3 {window}: " in result.stdout + result.stderr
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    assert table_rows(ws.paths("t_s3").final, ["ID", "VALUE"]) == expected
    first, second = sorted(s3_env.runs("cdc_t_s3"), key=lambda r: r["logical_date"])
    assert s3_env.task_states("cdc_t_s3", first["run_id"])["check"] == "success"
    for run in (first, second):
        states = s3_env.task_states("cdc_t_s3", run["run_id"])
        assert (states["stage"], states["overwrite_final"]) == ("success", "success")
    checked = ws.paths("t_s3").table_root / "_cdc_check.json"
    assert json.loads(store_for(checked).read_text(checked) or "{}")["ok"] is True
    assert not (local.root / "s3:").exists()
    # overwrite-final registered the table in the Connect server's catalog at its bucket
    # location: a user of the same server reads it by name (a client process of its own: this
    # one's PySpark must stay classic for the other tests).
    server = json.loads(env.spark_default)
    query = (
        "import json, sys; from spark_jobs.runtime.session import build_connect_session; "
        "spark = build_connect_session(sys.argv[1], 'e2e-catalog'); "
        "rows = spark.table('cdc.t_s3').select('ID', 'VALUE').collect(); "
        "print(json.dumps(sorted([list(r) for r in rows]))); spark.stop()"
    )
    read = subprocess.run(
        [sys.executable, "-c", query, f"sc://{server['host']}:{server['port']}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-2000:]
    assert [tuple(row) for row in json.loads(read.stdout.splitlines()[-1])] == expected


def test_scheduler_runs_an_overlapping_backfill_and_a_rest_triggered_run(
    airflow: tuple[AirflowEnv, Workspace],
) -> None:
    env, ws = airflow
    expected = land_hours(ws, "t_backfill", 3)
    rest_expected = land_hours(ws, "t_rest", 1)
    # The runs are queued before the scheduler starts (as `cdc demo` does: on SQLite a backfill
    # created beside the scheduler's writes can fail or stall every writer for a lock timeout).
    env.start_services(scheduler=False)
    env.wait_for_dags(["cdc_t_backfill", "cdc_t_rest"])  # parsed by the dag-processor
    # The REST API: log in, unpause, trigger the interval [00:00, 01:00). Done before the backfill
    # starts loading the machine; the run then goes on beside the backfill's runs.
    env.api("PATCH", "/dags/cdc_t_rest", {"is_paused": False})
    run = env.trigger(
        "cdc_t_rest",
        "rest__2024-01-01T01",
        {
            "logical_date": "2024-01-01T01:00:00Z",
            "data_interval_start": "2024-01-01T00:00:00Z",
            "data_interval_end": "2024-01-01T01:00:00Z",
        },
    )
    # The backfill as `cdc demo` queues it (REST: unpause, POST /backfills).
    backfill = queue_backfill(
        env,
        "cdc_t_backfill",
        datetime(2024, 1, 1, 0, tzinfo=UTC),
        datetime(2024, 1, 1, 2, tzinfo=UTC),
        3,
    )
    assert (backfill["dag_id"], backfill["max_active_runs"]) == ("cdc_t_backfill", 3)
    env.start("scheduler")

    # Poll the REST-triggered run.
    dags = ["cdc_t_rest", "cdc_t_backfill"]
    assert env.finished_state("cdc_t_rest", run, 420, dags) == "success", env.diagnose(dags)
    assert table_rows(ws.paths("t_rest").final, ["ID", "VALUE"]) == rest_expected
    # The step's counts are the task's XCom.
    entry = env.api(
        "GET",
        f"/dags/cdc_t_rest/dagRuns/{run['dag_run_id']}/taskInstances/overwrite_final/xcomEntries/return_value",
    )
    value = json.loads(entry["value"]) if isinstance(entry["value"], str) else entry["value"]
    assert value["step"] == "overwrite-final"
    assert (value["counts"]["changes"], value["counts"]["rows_written"]) == (2, 2)

    try:
        runs = env.wait_for_runs("cdc_t_backfill", 3, prefix="backfill__", timeout=240)
    except RuntimeError as error:
        raise AssertionError(f"{error}\n{env.diagnose(dags)}") from error
    assert [r["state"] for r in runs] == ["success"] * 3
    assert table_rows(ws.paths("t_backfill").final, ["ID", "VALUE"]) == expected
    spans = sorted(
        (datetime.fromisoformat(r["start_date"]), datetime.fromisoformat(r["end_date"]))
        for r in runs
    )
    overlaps = any(
        later_start < earlier_end
        for (_, earlier_end), (later_start, _) in itertools.pairwise(spans)
    )
    print(f"\nbackfill runs (start, end): {spans}; overlapping: {overlaps}")
    assert overlaps, "the backfill's runs were expected to overlap"
    # A check due in a run passed at its first try: a change another run had staged and not
    # applied yet is no breach (it was one, and the check task failed and retried).
    checks = [
        task
        for r in runs
        for task in env.api(
            "GET", f"/dags/cdc_t_backfill/dagRuns/{quote(r['run_id'], safe='')}/taskInstances"
        )["task_instances"]
        if task["task_id"] == "check" and task["state"] != "skipped"
    ]
    assert checks and {(t["state"], t["try_number"]) for t in checks} == {("success", 1)}, checks

    # A file lands in hour 00's folder after that hour's run: the next scheduled run applies it
    # (what a run reads is what has landed in its late-arrival window, not its own hour).
    ws.land(
        "t_backfill",
        "2024-01-01T00",
        "late.csv",
        [{"FLAG": "I", "ID": 99, "VALUE": 0, "TS": "2024-01-01 00:30:00"}],
    )
    late = env.trigger(
        "cdc_t_backfill",
        "late__2024-01-01T04",
        {
            "logical_date": "2024-01-01T04:00:00Z",
            "data_interval_start": "2024-01-01T03:00:00Z",
            "data_interval_end": "2024-01-01T04:00:00Z",
        },
    )
    assert env.finished_state("cdc_t_backfill", late, 180, dags) == "success", env.diagnose(dags)
    assert table_rows(ws.paths("t_backfill").final, ["ID", "VALUE"]) == sorted([*expected, (99, 0)])
    entry = env.api(
        "GET",
        f"/dags/cdc_t_backfill/dagRuns/{late['dag_run_id']}/taskInstances/overwrite_final/xcomEntries/return_value",
    )
    value = json.loads(entry["value"]) if isinstance(entry["value"], str) else entry["value"]
    assert (value["counts"]["files_applied"], value["counts"]["changes"]) == (1, 1)
    # The tasks ran under the local deployment's executor, which imported their code before
    # forking its workers (cdc_airflow/local/executor.py), and every module imported.
    assert env.log_dir is not None
    scheduler_log = (env.log_dir / "scheduler.log").read_text()
    assert "imported the task code before forking workers" in scheduler_log
    assert "preload of" not in scheduler_log


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and worker from the pip package, stopped by their own pids."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    port, web = free_port(), free_port()
    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home),
        SPARK_LOG_DIR=str(tmp_path),
        SPARK_WORKER_DIR=str(tmp_path / "work"),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    spark_class = str(spark_home / "bin" / "spark-class")
    processes = []
    try:
        processes.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(web),
                ],
                env=env,
                stdout=(tmp_path / "master.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        processes.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    f"spark://127.0.0.1:{port}",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                ],
                env=env,
                stdout=(tmp_path / "worker.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + 90
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text(
            errors="replace"
        ):
            assert time.monotonic() < deadline, "the Spark worker did not register"
            time.sleep(1)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def test_the_same_dag_runs_on_a_spark_standalone_cluster(
    airflow: tuple[AirflowEnv, Workspace], spark_cluster: str
) -> None:
    env, ws = airflow
    # One interval (each step is a spark-submit driver with executors on the workers: about
    # 100 s per interval on 2 cores): an insert, an update of it and another key.
    ws.land(
        "t_cluster",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 0, "TS": "2024-01-01 00:00:01"},
            {"FLAG": "I", "ID": 10, "VALUE": 0, "TS": "2024-01-01 00:00:02"},
            {"FLAG": "U", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:03"},
        ],
    )
    host, port = spark_cluster.rsplit(":", 1)
    cluster_env = AirflowEnv(
        env.home,
        env.config,
        env.landing,
        env.warehouse,
        spark_connection=f'{{"conn_type": "spark", "host": "{host}", "port": {port}}}',
        port=env.port,
    )
    result = cluster_env.airflow("dags", "test", "cdc_t_cluster", "2024-01-01T01:00:00+00:00")
    assert f"--master {spark_cluster}" in result.stdout + result.stderr
    assert table_rows(ws.paths("t_cluster").final, ["ID", "VALUE"]) == [(1, 1), (10, 0)]
    assert BIN.exists()


def test_cdc_tables_view_needs_login_and_shows_each_table(
    airflow: tuple[AirflowEnv, Workspace], tmp_path: Path
) -> None:
    import urllib.error
    import urllib.request

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    env, ws = airflow
    if not env.processes:
        env.start_services()
    artifacts = artifacts_folder()
    # Let the scheduler's own run of the latest hour finish, so the view and this test see the
    # same finished runs.
    deadline = time.monotonic() + 600
    while True:
        runs = env.api("GET", "/dags/cdc_t_backfill/dagRuns?limit=100")["dag_runs"]
        if all(r["state"] in ("success", "failed") for r in runs) or time.monotonic() > deadline:
            break
        time.sleep(5)
    finished = [r for r in runs if r["state"] in ("success", "failed")]
    assert any(r["state"] == "success" for r in finished), env.diagnose(["cdc_t_backfill"])
    newest = max(
        (r for r in finished if r["state"] == "success"),
        key=lambda r: datetime.fromisoformat(r["data_interval_end"]),
    )
    # The view's last run is the one that started last, whatever its interval and state.
    latest = max(finished, key=lambda r: datetime.fromisoformat(r["start_date"]))
    # Not logged in: the JSON is refused and the page sends to Airflow's login.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{env.url}/cdc-tables/api/tables", timeout=30)
    assert refused.value.code == 401
    with urllib.request.urlopen(f"{env.url}/cdc-tables/", timeout=30) as response:
        assert "/auth/login" in response.url
    # The plugin app publishes no API description (it is served outside Airflow's auth).
    for path in ("docs", "redoc", "openapi.json"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{env.url}/cdc-tables/{path}", timeout=30)
        assert missing.value.code == 404, path

    driver = chromium(tmp_path / "chromium")
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{env.url}/cdc-tables/")
        wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(env.admin_password())
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "table-t_backfill")))
        health, *cells = driver.find_elements(By.CSS_SELECTOR, "#table-t_backfill td")
        texts = [c.text for c in cells]
        # The one health state first, one of the four, counted in the header.
        state = health.text.splitlines()[0]
        assert state in ("ok", "warn", "error", "unknown"), health.text
        assert f" {state}" in driver.find_element(By.ID, "summary").text
        driver.save_screenshot(str(artifacts / "cdc_tables_view.png"))
        final = ws.paths("t_backfill").final
        from deltalake import DeltaTable

        assert texts[0].splitlines()[0] == "t_backfill"
        # The newest successful run: after unpausing, the scheduler also ran the latest hour.
        start = datetime.fromisoformat(newest["data_interval_start"])
        end = datetime.fromisoformat(newest["data_interval_end"])
        # Behind is measured by the data: every landed file is applied (no freshness: not red).
        hours = float(cells[1].get_attribute("data-hours") or "nan")
        assert hours == 0.0
        assert "every landed file applied" in texts[1]
        assert "late" not in (cells[1].get_attribute("class") or "")
        assert texts[2].startswith(f"[{start:%Y-%m-%d %H:%M}, {end:%Y-%m-%d %H:%M})")
        # The last run's state and counts (its steps' XCom, asked here through the REST API).
        assert texts[3].startswith(latest["state"]), (latest, texts[3])
        counts = {}
        for task in ("overwrite_final", "stage"):  # stage's `files` wins, as in the view
            entry = env.api(
                "GET",
                f"/dags/cdc_t_backfill/dagRuns/{latest['dag_run_id']}/taskInstances/{task}"
                "/xcomEntries/return_value",
            )
            value = (
                json.loads(entry["value"]) if isinstance(entry["value"], str) else entry["value"]
            )
            counts.update(value["counts"])
        labels = {
            "files": "files",
            "rows_read": "read",
            "staged": "staged",
            "rows_written": "written",
        }
        shown = [f"{label} {counts[key]}" for key, label in labels.items() if key in counts]
        print(f"\nlatest run {latest['dag_run_id']}: counts {counts}; cell {texts[3]!r}")
        assert shown and all(part in texts[3] for part in shown), (shown, texts[3])
        # The attempts timeline: one line per finished run at most, each starting with its state.
        assert len(cells) == 12, texts  # the 13 columns of the page, Health aside
        runs_shown = driver.find_elements(By.CSS_SELECTOR, "#table-t_backfill td.attempts li")
        states = [li.text.split()[0] for li in runs_shown]
        assert states and set(states) <= {"success", "failed"}, texts[4]
        assert len(states) == min(len(finished), 5), texts[4]  # the last 5 finished runs
        # Sparklines of the finished runs (inline SVG), quarantine growth, the final table.
        for column in ("spark-rows", "spark-seconds", "quarantine"):
            title = driver.find_element(
                By.CSS_SELECTOR, f"#table-t_backfill td.{column} svg title"
            ).get_attribute("textContent")
            assert title is not None and title.endswith(f" over {len(finished)} runs"), column
        assert f"+0 over {len(finished)} runs" in texts[7]
        assert texts[8].startswith(f"{len(table_rows(final, ['ID']))} rows")
        assert f"v{DeltaTable(str(final)).version()}," in texts[8]
        # Final's timeline: its newest commits, newest first, with the step that made each.
        newest_commits = DeltaTable(str(final)).history(limit=5)
        timeline = texts[9].splitlines()
        assert len(timeline) == len(newest_commits), timeline
        for line, entry in zip(timeline, newest_commits, strict=True):
            step = entry.get("cdc_step") or entry["operation"]
            assert line.startswith(f"v{entry['version']} ") and f" {step}, +" in line, line
        check_file = ws.paths("t_backfill").table_root / "_cdc_check.json"
        if check_file.exists():  # the DAG's check task writes it
            check = json.loads(check_file.read_text())
            assert texts[10].startswith("ok" if check["ok"] else f"breach: {check['breaches'][0]}")
        else:
            assert texts[10] == "not checked"
        # Links are relative to the page (so a sub-path deployment works) and lead to the DAG.
        link = driver.find_element(By.CSS_SELECTOR, "#table-t_backfill a")
        assert link.get_dom_attribute("href") == "../dags/cdc_t_backfill"
        assert link.get_attribute("href") == f"{env.url}/dags/cdc_t_backfill"
        assert {
            r.get_attribute("id") for r in driver.find_elements(By.CSS_SELECTOR, "tbody tr")
        } == {f"table-{t}" for t in TABLES}
        # The DAG's grid in the Airflow UI, reached through the view's link.
        link.click()
        wait.until(lambda d: "cdc_t_backfill" in d.find_element(By.TAG_NAME, "body").text)
        assert driver.current_url == f"{env.url}/dags/cdc_t_backfill"
        time.sleep(3)  # let the grid render for the screenshot
        driver.save_screenshot(str(artifacts / "dag_grid.png"))
        # The view is in the UI's navigation as a plugin page.
        driver.get(f"{env.url}/plugin/cdc-tables")
        time.sleep(3)
        driver.save_screenshot(str(artifacts / "cdc_tables_in_airflow_ui.png"))
    finally:
        driver.quit()


IPV4_MAPPED = "0000000000000000FFFF0000"  # ::ffff:a.b.c.d as /proc/net/tcp6 writes it


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` (/proc/net/tcp and tcp6), as hex.

    An IPv4-mapped IPv6 listener (a JVM bound to 127.0.0.1 listens as ::ffff:127.0.0.1) is
    given as its IPv4 address.
    """
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address.removeprefix(IPV4_MAPPED))
    return found


def local_ipv4_addresses() -> set[str]:
    """This machine's own IPv4 addresses (the kernel's LOCAL routes in /proc/net/fib_trie)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    return {
        previous.split()[-1]
        for previous, line in itertools.pairwise(lines)
        if line.strip() == "/32 host LOCAL"
    }


def test_the_local_api_server_listens_on_loopback_only_and_the_pools_exist(
    airflow: tuple[AirflowEnv, Workspace],
) -> None:
    import socket

    from cdc_airflow.local.launcher import json_rows

    env, _ = airflow
    if not env.processes:
        env.start_services()
    # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex); nothing on 0.0.0.0 or ::.
    assert listening_addresses(env.port) == {"0100007F"}
    assert listening_addresses(env.connect_port) == {"0100007F"}  # the Spark Connect server
    others = {a for a in local_ipv4_addresses() if not a.startswith("127.")}
    for address in others:  # this machine's other addresses refuse the port
        with pytest.raises(OSError), socket.create_connection((address, env.port), timeout=5):
            pass
    print(
        f"\napi-server on 127.0.0.1:{env.port}; refused on {sorted(others) or 'no other address'}"
    )
    pools = {p["pool"]: p for p in json_rows(env.airflow("pools", "list", "-o", "json").stdout)}
    assert {f"cdc_{t}" for t in TABLES} <= set(pools)
    assert {pools[f"cdc_{t}"]["slots"] for t in TABLES} == {"1"}
