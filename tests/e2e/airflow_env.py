"""A real Airflow 3 installation for end-to-end tests: its own home, SQLite, LocalExecutor.

Services run in their own process groups and are stopped by their own pids, never by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "cdc-admin-pw"


def json_rows(output: str) -> list[dict[str, Any]]:
    """The JSON list an airflow command printed, after any warning lines it printed first."""
    for line in output.splitlines():
        if line.startswith(("[{", "[]")):
            return list(json.loads(line))
    raise AssertionError(f"no JSON list in: {output[-2000:]}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class AirflowEnv:
    """An Airflow home under `root` reading the repo's dags/ and plugins/ with a given CDC config."""

    root: Path
    config: Path
    landing: Path
    warehouse: Path
    spark_connection: str = '{"conn_type": "spark", "host": "local[2]"}'
    port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "airflow_home"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{self.home}/airflow.db",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="2",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.url}/execution/",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__BASE_URL=self.url,
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.home / "passwords.json"),
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
            AIRFLOW_CONN_SPARK_DEFAULT=self.spark_connection,
            CDC_CONFIG=str(self.config),
            CDC_LANDING=str(self.landing),
            CDC_WAREHOUSE=str(self.warehouse),
            CDC_SHUFFLE_PARTITIONS="2",
        )
        env.pop("CDC_SPARK_MASTER", None)
        return env

    def airflow(self, *args: str, timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(BIN / "airflow"), *args], env=self.environment(), capture_output=True,
                                text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({"admin": ADMIN_PASSWORD}))
        self.airflow("db", "migrate")

    def start(self, *component: str) -> None:
        """Start an Airflow component (api-server, scheduler, dag-processor) in its own group."""
        log = (self.root / f"{'-'.join(component)}.log").open("wb")
        process = subprocess.Popen([str(BIN / "airflow"), *component], env=self.environment(), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)

    def start_services(self) -> None:
        self.start("api-server", "--port", str(self.port))
        self.start("scheduler")
        self.start("dag-processor")
        self.wait_for_api()

    def wait_for_api(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"api-server did not answer on {self.url}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self.processes.clear()

    def token(self) -> str:
        request = urllib.request.Request(
            f"{self.url}/auth/token", data=json.dumps({"username": "admin", "password": ADMIN_PASSWORD}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}", data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token()}"}, method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return json_rows(self.airflow("dags", "list-runs", dag_id, "-o", "json").stdout)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        rows = json_rows(self.airflow("tasks", "states-for-dag-run", dag_id, run_id, "-o", "json").stdout)
        return {row["task_id"]: row["state"] for row in rows}

    def wait_for_runs(self, dag_id: str, count: int, prefix: str = "", timeout: float = 900) -> list[dict[str, Any]]:
        """Wait until `count` runs whose run_id starts with `prefix` have finished."""
        deadline = time.monotonic() + timeout
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            runs = [r for r in self.runs(dag_id)
                    if r["state"] in ("success", "failed") and r["run_id"].startswith(prefix)]
            if len(runs) >= count:
                return runs
            time.sleep(5)
        raise AssertionError(f"{dag_id}: {len(runs)} of {count} runs finished in time; logs in {self.root}")
