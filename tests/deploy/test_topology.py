"""The deployment of docker-compose.yaml, run as processes (tests/deploy/topology.py): Airflow's
api-server, scheduler, dag-processor, triggerer and Celery worker on PostgreSQL and Redis, a Spark
standalone master with two workers and the Connect server as the cluster's driver, landing and
warehouse in an S3 server. A backfill of three tables, then each fault of a real deployment
during a run: the scheduler killed, the Celery worker killed during a rewrite, the Connect server
restarted during a cycle, PostgreSQL stopped for 30 s. After each, every run has succeeded, every
table equals its reference model exactly (an insert-only table shows a change applied twice as
a duplicate row) and the failed try says why it failed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from cdc_pipeline.paths import ObjectPath
from tests import postgres, s3
from tests.deploy.topology import AIRFLOW, Topology, running
from tests.e2e.test_airflow import row
from tests.helpers import Workspace, table_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

UPSERT = ("t1", "t2")
APPEND = "t3"  # insert-only
TABLES = (*UPSERT, APPEND)
AWS = (
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
)


def missing() -> str | None:
    if not AIRFLOW.exists():
        return "the image's environment .tools/deploy is missing: run make test (or make install)"
    return postgres.available() or s3.available()


class Model:
    """The expected final tables: what each landed hour does to them."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, int]] = {t: {} for t in TABLES}
        self.hours: dict[str, int] = {t: 0 for t in TABLES}  # hours landed (and backfilled)

    def land(self, ws: Workspace, table: str, hour: int) -> None:
        ts = f"2024-01-01 {hour:02d}:00:0"
        if table == APPEND:
            changes = [
                {"FLAG": "I", "ID": 100 * hour + n, "VALUE": hour, "TS": ts + "1"} for n in (1, 2)
            ]
        else:
            # Key 1 updated, a new key, and from the third hour the key of two hours before
            # deleted by its key alone.
            changes = [
                {"FLAG": "U" if hour else "I", "ID": 1, "VALUE": hour, "TS": ts + "1"},
                {"FLAG": "I", "ID": 10 + hour, "VALUE": hour, "TS": ts + "2"},
            ]
            if hour >= 2:
                changes.append({"FLAG": "D", "ID": 10 + hour - 2, "VALUE": None, "TS": ts + "3"})
        ws.land(table, f"2024-01-01T{hour:02d}", "a.csv", changes)
        self.hours[table] += 1
        for change in changes:
            if change["FLAG"] == "D":
                self.rows[table].pop(int(change["ID"]), None)
            else:
                self.rows[table][int(change["ID"])] = int(change["VALUE"])

    def expected(self, table: str) -> list[tuple[int, int]]:
        return sorted(self.rows[table].items())


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Topology, Workspace, Model]]:
    reason = missing()
    if reason:
        pytest.fail(reason)
    root = tmp_path_factory.mktemp("topology")
    ws = Workspace(root / "ws", ObjectPath("cdc", ""))  # the compose file's bucket
    (root / "ws").mkdir()
    rows = [row(t) for t in UPSERT] + [{**row(APPEND), "insert_only": True}]
    ws.config_path.write_text(yaml.safe_dump({"tables": rows}))
    with running(root / "run", ws.config_path) as topology, pytest.MonkeyPatch.context() as mp:
        for name in AWS:
            mp.setenv(name, topology.env[name])  # this test's own landing and reads
        # One CLI start for the three DAGs (each start costs 10-20 s on a loaded machine).
        pattern = "^cdc_(" + "|".join(re.escape(t) for t in TABLES) + ")$"
        result = topology.airflow("dags", "unpause", "--treat-dag-id-as-regex", "-y", pattern)
        assert result.returncode == 0, result.stderr[-2000:]
        dags = ", ".join(f"'cdc_{t}'" for t in TABLES)
        found = topology.metadata(f"SELECT dag_id, is_paused FROM dag WHERE dag_id IN ({dags})")
        assert sorted((r["dag_id"], r["is_paused"]) for r in found) == [
            (f"cdc_{t}", False) for t in sorted(TABLES)
        ], result.stdout[-2000:]
        yield topology, ws, Model()


def wait_for(what: str, ready: Callable[[], Any], timeout: float, topology: Topology) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = ready()
        if found:
            return found
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}\n{topology.log(name, 15)}" for name in topology.services)
            raise AssertionError(f"{what} not seen in {timeout} s\n{logs}")
        time.sleep(1)


def backfill(topology: Topology, tables: tuple[str, ...], first: int, last: int) -> None:
    """Queue a backfill of each table's hours `first`..`last` through the REST API, as the UI
    does: all within a second, so their runs overlap (one CLI start per table took 10-20 s, and
    the first table's runs could end before the last was queued)."""
    for table in tables:
        topology.rest(
            "POST",
            "/backfills",
            {
                "dag_id": f"cdc_{table}",
                "from_date": f"2024-01-01T{first:02d}:00:00+00:00",
                "to_date": f"2024-01-01T{last:02d}:00:00+00:00",
                "max_active_runs": 10,  # the CLI's defaults
                "reprocess_behavior": "none",
            },
        )


def backfill_runs(topology: Topology, tables: tuple[str, ...]) -> list[dict[str, Any]]:
    dags = ", ".join(f"'cdc_{t}'" for t in tables)
    return topology.metadata(
        "SELECT dag_id, run_id, state::text AS state, "
        "to_char(logical_date AT TIME ZONE 'UTC', 'HH24') AS hour FROM dag_run "
        f"WHERE run_type = 'backfill' AND dag_id IN ({dags})"
    )


def finished(topology: Topology, model: Model) -> list[dict[str, Any]]:
    """Every backfill run, once each table has one per landed hour and all have ended, else []."""
    runs = backfill_runs(topology, TABLES)
    if any(r["state"] not in ("success", "failed") for r in runs):
        return []
    # A backfill ends after its runs (the scheduler marks it); until then no other may start.
    if topology.metadata("SELECT id FROM backfill WHERE completed_at IS NULL"):
        return []
    counts = {t: sum(r["dag_id"] == f"cdc_{t}" for r in runs) for t in TABLES}
    return runs if counts == model.hours else []


def running_task(topology: Topology, task: str, tables: tuple[str, ...]) -> dict[str, Any] | None:
    """A running try of `task` in a backfill run of these tables (not the scheduled run the
    unpaused DAGs start at first, when a test runs before any other)."""
    dags = ", ".join(f"'cdc_{t}'" for t in tables)
    found = topology.metadata(
        "SELECT ti.dag_id, ti.run_id, ti.task_id, ti.try_number FROM task_instance ti "
        "JOIN dag_run r ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id "
        f"WHERE ti.state = 'running' AND ti.task_id = '{task}' AND ti.dag_id IN ({dags}) "
        "AND r.run_type = 'backfill'"
    )
    return found[0] if found else None


def tries(topology: Topology, task: str, run: dict[str, Any]) -> int:
    found = topology.metadata(
        "SELECT try_number FROM task_instance "
        f"WHERE dag_id = '{run['dag_id']}' AND run_id = '{run['run_id']}' AND task_id = '{task}'"
    )
    return int(found[0]["try_number"])


def retried_tasks(topology: Topology, runs: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The task instances of these (table, hour) backfill runs that took more than one try."""
    found = topology.metadata(
        "SELECT ti.dag_id, ti.run_id, ti.task_id, ti.try_number, "
        "to_char(r.logical_date AT TIME ZONE 'UTC', 'HH24') AS hour FROM task_instance ti "
        "JOIN dag_run r ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id "
        "WHERE ti.try_number > 1 AND r.run_type = 'backfill'"
    )
    return [t for t in found if (t["dag_id"].removeprefix("cdc_"), t["hour"]) in runs]


def task_log(topology: Topology, ti: dict[str, Any], attempt: int) -> str:
    path = (
        topology.root
        / "home"
        / "logs"
        / f"dag_id={ti['dag_id']}"
        / f"run_id={ti['run_id']}"
        / f"task_id={ti['task_id']}"
        / f"attempt={attempt}.log"
    )
    return path.read_text(errors="replace") if path.exists() else ""


def assert_exact(ws: Workspace, model: Model, runs: list[dict[str, Any]]) -> None:
    assert {r["state"] for r in runs} == {"success"}, runs
    for table in (t for t in TABLES if model.hours[t]):  # each has a final (also with -k)
        got = table_rows(ws.paths(table).final, ["ID", "VALUE"])
        assert sorted(got) == model.expected(table), table


def test_a_backfill_of_three_tables_survives_the_scheduler_killed(
    deployment: tuple[Topology, Workspace, Model],
) -> None:
    topology, ws, model = deployment
    for table in TABLES:
        for hour in (0, 1):
            model.land(ws, table, hour)
    backfill(topology, TABLES, 0, 1)
    wait_for("a running stage", lambda: running_task(topology, "stage", TABLES), 300, topology)
    topology.kill("airflow-scheduler")  # the restart policy starts it again
    runs = wait_for("6 finished runs", lambda: finished(topology, model), 900, topology)
    assert topology.services["airflow-scheduler"].restarts == 1
    assert_exact(ws, model, runs)


def test_the_celery_worker_killed_during_a_rewrite(
    deployment: tuple[Topology, Workspace, Model],
) -> None:
    topology, ws, model = deployment
    tables = ("t1", APPEND)
    for table in tables:
        model.land(ws, table, 2)
    backfill(topology, tables, 2, 2)
    rewrite = wait_for(
        "a running rewrite",
        lambda: running_task(topology, "overwrite_final", tables),
        300,
        topology,
    )
    # At once: a small table's rewrite takes 2-3 s with the task's start-up, and a kill 2 s
    # after it was seen running once came after it had succeeded. The try dies either in its
    # start-up or in its step, before its commit; both must leave final exact.
    topology.kill("airflow-worker")
    runs = wait_for("the killed rewrite retried", lambda: finished(topology, model), 600, topology)
    assert topology.services["airflow-worker"].restarts == 1
    assert_exact(ws, model, runs)
    killed = next(
        r for r in runs if (r["dag_id"], r["run_id"]) == (rewrite["dag_id"], rewrite["run_id"])
    )
    assert tries(topology, "overwrite_final", killed) == rewrite["try_number"] + 1
    # The killed try ended inside the step (no summary): the retry finished its rewrite.
    assert "CDC summary: overwrite-final" not in task_log(topology, rewrite, rewrite["try_number"])
    # The scheduler said why the try failed, with the task it gave up on.
    events = topology.metadata(
        "SELECT extra FROM log WHERE event = 'heartbeat timeout' "
        f"AND dag_id = '{rewrite['dag_id']}' AND run_id = '{rewrite['run_id']}' "
        "AND task_id = 'overwrite_final'"
    )
    assert events and "did not emit heartbeat" in events[0]["extra"], events


def outage_seen_by_scheduler(said: str, ti: str) -> bool:
    """Whether the scheduler's log (`said`) shows the task instance `ti` (its repr up to the run
    id) reset as orphaned, or reported finished by the executor while the database still said
    running (its state change lost in the outage)."""
    resets = re.findall(r"orphaned TaskInstances:\n((?:\t[^\n]*\n?)+)", said)
    lost = re.search(
        re.escape(f"reported that the task instance {ti}") + r"\[running\][^\n]*"
        r"but the task instance's state attribute is running",
        said,
    )
    return any(ti in block for block in resets) or lost is not None


def supervisor_gave_up(worker_log: str, failed: str) -> bool:
    """Whether the worker's log shows the supervisor of the try whose log is `failed` (its
    records carry the try's ti_id) failing its third heartbeat and terminating the task."""
    found = re.search(r'"ti_id":\s*"([0-9a-f-]{36})"', failed)
    if found is None:
        return False
    third = re.compile(
        r"Failed to send heartbeat[^\n]*failed_heartbeats=3[^\n]*"
        + re.escape(f"ti_id=UUID('{found.group(1)}')")
    )
    return third.search(worker_log) is not None and "Too many failed heartbeats" in worker_log


def logged_errors(log: str) -> str:
    """The error records of a task's log (what a failed assertion shows), each cut to 1500."""
    return "\n".join(line[:1500] for line in log.splitlines() if '"level":"error"' in line)


def land_and_backfill(
    topology: Topology, ws: Workspace, model: Model, hours: dict[str, int]
) -> None:
    """Land one hour of changes per table, backfill that hour, and return once a stage runs."""
    for table, hour in hours.items():
        model.land(ws, table, hour)
    for table, hour in hours.items():
        backfill(topology, (table,), hour, hour)
    wait_for("a running stage", lambda: running_task(topology, "stage", TABLES), 300, topology)


def intervals(hours: dict[str, int]) -> set[tuple[str, str]]:
    """(table, hour) of each backfilled interval, as retried_tasks takes them."""
    return {(table, f"{hour:02d}") for table, hour in hours.items()}


def test_the_connect_server_restarted_during_a_cycle(
    deployment: tuple[Topology, Workspace, Model],
) -> None:
    topology, ws, model = deployment
    hours = {"t1": 3, "t2": 2, APPEND: 3}
    land_and_backfill(topology, ws, model, hours)
    topology.stop("spark-connect")
    topology.start_again("spark-connect")  # docker restart
    runs = wait_for("the cycle retried", lambda: finished(topology, model), 900, topology)
    assert_exact(ws, model, runs)
    # The step whose session the restart ended failed once, saying so; its retry succeeded.
    retried = retried_tasks(topology, intervals(hours))
    assert retried, "no task of the cycle failed: the restart came too late"
    for task in retried:
        failed = task_log(topology, task, task["try_number"] - 1)
        # "... restarted or stopped answering during the step (...)", or "... is not
        # reachable (...)" for a step that started while it was down.
        named = "Spark Connect server of connection 'spark_default' at sc://127.0.0.1:"
        assert named in failed, logged_errors(failed)


def test_postgresql_stopped_for_30_seconds(
    deployment: tuple[Topology, Workspace, Model],
) -> None:
    topology, ws, model = deployment
    hours = {"t1": 4, "t2": 3, APPEND: 4}
    land_and_backfill(topology, ws, model, hours)
    assert topology.pg is not None
    scheduler_log = topology.root / "airflow-scheduler.log"
    before = scheduler_log.stat().st_size
    topology.pg.stop()
    time.sleep(30)
    topology.pg.start_again()
    runs = wait_for("the runs after the outage", lambda: finished(topology, model), 900, topology)
    assert_exact(ws, model, runs)
    # The scheduler said what was down (and exited; the restart policy started it again).
    with scheduler_log.open("rb") as log:
        log.seek(before)
        said = log.read().decode(errors="replace")
    refused = (
        f'connection to server at "127.0.0.1", port {topology.pg.port} failed: Connection refused'
    )
    assert refused in said
    # A task whose try met the outage failed naming the metadata database (the api-server's
    # "Database error"), or was ended by it, as the logs since the outage say: its supervisor
    # terminated it after 3 failed heartbeats, 5 s apart (in the try's log or the worker's); the
    # restarted scheduler reset it as orphaned (queued when the scheduler exited: it never ran);
    # or its success was never recorded (the executor said success, the database still said
    # running: Airflow retries such a try). Its retry succeeded, and final is exact above.
    causes = ("Database error", "Connection refused", "Too many failed heartbeats")
    worker_log = (topology.root / "airflow-worker.log").read_text(errors="replace")
    for task in retried_tasks(topology, intervals(hours)):
        failed = task_log(topology, task, task["try_number"] - 1)
        ti = f"<TaskInstance: {task['dag_id']}.{task['task_id']} {task['run_id']} "
        ended = outage_seen_by_scheduler(said, ti) or supervisor_gave_up(worker_log, failed)
        assert any(cause in failed for cause in causes) or ended, (
            task,
            logged_errors(failed) or failed[-3000:] or "no log for the failed try",
        )
