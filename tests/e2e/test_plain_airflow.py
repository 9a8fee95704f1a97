"""The DAG package in an Airflow nobody prepared for it, as MWAA, Composer and Astronomer users
deploy one: `dags/` and `plugins/` copied into the DAGs and plugins folders of `airflow
standalone` (Airflow's own defaults: its executor, parallelism and auth manager; no launcher,
no pool, no variable), `CDC_CONFIG` set and `spark_default` pointing at a Spark Connect server.
A backfill queued with Airflow's own CLI runs to the exact table.

The DAG is parsed (`airflow dags reserialize`) and the backfill queued before standalone starts,
as the demo does: on standalone's SQLite every component writes, and a `backfill create` that
waited out the lock was rolled back by Airflow, deleting runs its scheduler had already taken,
which killed the scheduler (`ObjectDeletedError`, seen once in a full run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from cdc_airflow.local.connect_server import free_port
from cdc_airflow.local.launcher import connect_connection
from cdc_airflow.local.runs import MetadataDB, wait_for_dag_runs
from cdc_pipeline.jvm import connect_address
from cdc_tools.bench.processes import role_of
from tests.e2e.test_airflow import land_hours, row
from tests.helpers import Workspace, stop_process_group, table_rows

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = Path(sys.executable).parent / "airflow"


def plain_environment(
    home: Path, deploy: Path, ws: Workspace, spark_default: str
) -> dict[str, str]:
    """The machine's environment without any Airflow or CDC setting of this project's launcher,
    plus what a user sets for a deployment: where Airflow lives, the DAG and plugin folders,
    the config table, landing and warehouse, and spark_default."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AIRFLOW", "CDC_", "SPARK_", "PYSPARK"))
    }
    port = free_port()  # not 8080: another Airflow may run on this machine
    env.update(
        # standalone starts its components as `airflow ...` from PATH, as an installed Airflow.
        PATH=f"{AIRFLOW.parent}{os.pathsep}{env.get('PATH', '')}",
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(deploy / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(deploy / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__API__PORT=str(port),
        # Where task processes reach the api-server (Airflow's default assumes port 8080).
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/",
        AIRFLOW_CONN_SPARK_DEFAULT=spark_default,
        CDC_CONFIG=str(ws.config_path),
        CDC_LANDING=str(ws.landing),
        CDC_WAREHOUSE=str(ws.warehouse),
    )
    return env


@dataclass
class Standalone:
    """`airflow standalone` for the user's environment and workspace, started by `start`
    (logging to `log`)."""

    env: dict[str, str]
    ws: Workspace
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start standalone in a process group of its own."""
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [str(AIRFLOW), "standalone"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def components(self) -> dict[str, bool]:
        """Whether each of the components standalone starts (and never restarts) still runs,
        told by the titles the bench's sampler reads (api-server retitles itself)."""
        running = set()
        assert self.process is not None, "standalone was not started"
        with contextlib.suppress(psutil.NoSuchProcess):  # standalone itself gone: none runs
            for child in psutil.Process(self.process.pid).children():
                with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                    running.add(role_of(child.cmdline(), None))
        return {c: c in running for c in COMPONENTS}

    def wait_until_up(self, timeout: float = 180) -> None:
        """Wait until every component standalone starts is running."""
        deadline = time.monotonic() + timeout
        while not all(self.components().values()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not up in {timeout:.0f} s; {self.diagnosis('cdc_plain')}")
            time.sleep(1)

    def diagnosis(self, dag_id: str) -> str:
        """What to read when runs do not move: components, the DAG's and backfill's rows, the
        log's errors (standalone's default SQLite DB is written by four processes)."""
        db = Path(self.env["AIRFLOW_HOME"]) / "airflow.db"
        with contextlib.closing(
            sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=60)
        ) as connection:
            dag = connection.execute(
                "SELECT is_paused, is_stale, last_parsed_time FROM dag WHERE dag_id = ?", (dag_id,)
            ).fetchall()
            backfills = connection.execute(
                "SELECT id, is_paused, max_active_runs, completed_at FROM backfill"
            ).fetchall()
        lines = self.log.read_text(errors="replace").splitlines()
        errors = [
            line for line in lines if any(w in line for w in ("Error", "error ", "Traceback"))
        ]
        return (
            f"components running: {self.components()}; dag (is_paused, is_stale, "
            f"last_parsed_time): {dag}; backfills: {backfills}\nlog errors (last 30):\n"
            + "\n".join(errors[-30:])
            + "\nlog (last 40 lines):\n"
            + "\n".join(lines[-40:])
        )


COMPONENTS = ("scheduler", "dag_processor", "api_server", "triggerer")


@pytest.fixture
def standalone(tmp_path: Path, connect_server: Any) -> Iterator[Standalone]:
    """`airflow standalone` with the package deployed into it; stopped by its process group."""
    deploy = tmp_path / "deploy"
    for folder in ("dags", "plugins"):
        shutil.copytree(
            REPO / folder, deploy / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    ws = Workspace(tmp_path / "data")
    ws.root.mkdir(parents=True)
    ws.config_path.write_text(yaml.safe_dump({"tables": [row("plain")]}))
    host, port = connect_address(connect_server.url)
    env = plain_environment(tmp_path / "home", deploy, ws, connect_connection(port, host))
    standalone = Standalone(env, ws, tmp_path / "standalone.log")
    try:
        yield standalone
    finally:
        if standalone.process is not None:
            stop_process_group(standalone.process)
            # What outlived standalone in its group: the executor's workers of a scheduler that
            # died (they ignore SIGTERM and stay idle for good once their scheduler is gone).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(standalone.process.pid, signal.SIGKILL)


def airflow_cli(env: dict[str, str], *args: str) -> str:
    """Run an `airflow` command as a user would, retrying while SQLite is locked: standalone's
    default metadata database is one SQLite file its scheduler, dag-processor and api-server
    write to, and a write that waits past SQLite's busy timeout fails with "database is locked"
    (it happened once in CI under load: `backfill create` failed and was rolled back)."""
    for _ in range(5):
        result = subprocess.run(
            [str(AIRFLOW), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode == 0 or "database is locked" not in result.stderr:
            break
        time.sleep(3)
    errors = [line for line in result.stderr.splitlines() if "Error" in line]
    assert result.returncode == 0, (args, errors[-5:], result.stderr[-3000:])
    return result.stdout


def test_a_backfill_runs_to_the_exact_table_in_an_airflow_nobody_prepared(
    standalone: Standalone,
) -> None:
    env, ws = standalone.env, standalone.ws
    started = time.monotonic()
    expected = land_hours(ws, "plain", 3)
    airflow_cli(env, "db", "migrate")
    airflow_cli(env, "dags", "reserialize")
    db = MetadataDB(Path(env["AIRFLOW_HOME"]) / "airflow.db")
    assert_parsed(db, "cdc_plain")
    airflow_cli(env, "dags", "unpause", "cdc_plain")
    airflow_cli(
        env,
        "backfill",
        "create",
        "--dag-id",
        "cdc_plain",
        "--from-date",
        "2024-01-01T00:00:00+00:00",
        "--to-date",
        "2024-01-01T02:00:00+00:00",
    )
    print(f"parsed and backfill created after {time.monotonic() - started:.0f} s")
    standalone.start()
    standalone.wait_until_up()

    def components_alive(_: object) -> None:
        # Standalone never restarts a component that exits: a dead scheduler is a failure now,
        # with its log, not a wait for the timeout.
        stopped = [c for c, running in standalone.components().items() if not running]
        assert not stopped, f"{stopped} exited; {standalone.diagnosis('cdc_plain')}"

    try:
        runs = wait_for_dag_runs(
            db,
            ["cdc_plain"],
            3,
            select=lambda r: r.run_type == "backfill",
            label="plain airflow backfill",
            # Ends before pytest's 900 s (setup and the parse included), so that what fails is
            # the diagnosis below (CI once spent 389 s before this wait on a slow machine).
            timeout=max(120.0, 780 - (time.monotonic() - started)),
            on_poll=components_alive,
        )
    except RuntimeError as error:
        raise AssertionError(f"{error}; {standalone.diagnosis('cdc_plain')}") from error
    assert sorted(r.state for r in runs) == ["success"] * 3, runs
    assert table_rows(ws.paths("plain").final, ["ID", "VALUE"]) == expected
    # Nothing was made for the package: the only pool is Airflow's own.
    with sqlite3.connect(f"file:{db.path}?mode=ro", uri=True) as connection:
        pools = [name for (name,) in connection.execute("SELECT pool FROM slot_pool")]
    assert pools == ["default_pool"]


def assert_parsed(db: MetadataDB, dag_id: str) -> None:
    """The DAG is in the metadata DB (parsed); if not, the import errors say why."""
    if not db.paused([dag_id]):
        raise AssertionError(f"{dag_id} was not parsed; import errors: {db.import_errors()}")
