"""The e2e tests' Airflow: the project's LocalAirflow plus REST helpers."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from cdc_airflow.local.connect_server import free_port
from cdc_airflow.local.launcher import BIN, LocalAirflow

__all__ = ["BIN", "AirflowEnv", "free_port"]

# SQLite makes a request wait up to 60 s for its write lock (see LocalAirflow.environment), and on
# 2 cores the api-server shares the CPU with the scheduler and two Spark tasks: a request may be
# slow without anything being wrong. The client waits longer than the lock, and asks again after
# a timeout (every request below is idempotent).
REQUEST_TIMEOUT = 120
ATTEMPTS = 3


def send(request: urllib.request.Request) -> Any:
    """The JSON answer to an idempotent request, asked again after a timeout or a refused connection."""
    for attempt in range(1, ATTEMPTS + 1):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError:
            raise
        except (TimeoutError, urllib.error.URLError) as error:
            print(
                f"{request.get_method()} {request.full_url}: attempt {attempt} failed after "
                f"{time.monotonic() - started:.0f} s: {error}"
            )
            if attempt == ATTEMPTS:
                raise
            time.sleep(5 * attempt)
    raise AssertionError("unreachable")


class AirflowEnv(LocalAirflow):
    """LocalAirflow with a logged-in REST client."""

    def token(self) -> str:
        body = json.dumps({"username": "admin", "password": self.admin_password()}).encode()
        request = urllib.request.Request(
            f"{self.url}/auth/token",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        return str(send(request)["access_token"])

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token()}"},
            method=method,
        )
        return send(request)

    def trigger(self, dag_id: str, run_id: str, body: dict[str, Any]) -> Any:
        """Trigger a run with a given run_id; a retry that finds it already created returns it."""
        try:
            return self.api("POST", f"/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, **body})
        except urllib.error.HTTPError as error:
            if error.code != 409:  # 409: the run exists, created by an attempt that timed out
                raise
            return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def finished_state(
        self, dag_id: str, run: dict[str, Any], timeout: float, dags: Sequence[str] = ()
    ) -> str:
        """The run's state once it is success or failed; a run still going after `timeout`
        seconds fails the test with what the scheduler, the tasks and the Spark server of the
        runs of `dags` (default: the run's DAG) were doing."""
        deadline = time.monotonic() + timeout
        state = str(run["state"])
        while state not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{dag_id} {run['dag_run_id']} still {state} after {timeout:.0f} s\n"
                    + self.diagnose(dags or [dag_id])
                )
            time.sleep(5)
            state = self.api("GET", f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}")["state"]
        return state

    def diagnose(self, dag_ids: Sequence[str]) -> str:
        """What a stalled test needs to say: whether each Airflow process lives, the unfinished
        runs' task states (state, try, start), the scheduler's last errors and what the Connect
        server's query threads are doing (the full thread dump goes to the log directory)."""
        lines = [
            f"{cast(list[str], process.args)[1]} (pid {process.pid}): "
            + ("running" if process.poll() is None else f"exited {process.returncode}")
            for process in self.processes
        ]
        for dag_id in dag_ids:
            for run in self.api("GET", f"/dags/{dag_id}/dagRuns?limit=50")["dag_runs"]:
                if run["state"] == "success":
                    continue
                path = f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances"
                tasks = self.api("GET", path)["task_instances"]
                states = ", ".join(
                    f"{t['task_id']}={t['state']}#{t['try_number']}@{(t.get('start_date') or '-')[11:19]}"
                    for t in tasks
                )
                lines.append(f"{dag_id} {run['dag_run_id']} {run['state']}: {states}")
        logs = self.log_dir or self.home / "logs"
        scheduler = logs / "scheduler.log"
        if scheduler.exists():
            errors = [
                line
                for line in scheduler.read_text(errors="replace").splitlines()
                if "ERROR" in line or "Traceback" in line or "Error:" in line
            ]
            lines += ["scheduler errors (last 10):", *errors[-10:]]
        if self.connect_server is not None:
            lines.append(self.server_threads(logs / "spark-connect-threads.txt"))
        return "\n".join(lines)

    def server_threads(self, dump_path: Path) -> str:
        """The Connect server JVM's thread dump written to `dump_path`; returned: the count of
        threads per state and the top frames of its query threads and blocked threads."""
        assert self.connect_server is not None
        try:
            dump = subprocess.run(
                ["jcmd", str(self.connect_server.pid), "Thread.print"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"connect server threads: jcmd failed: {error}"
        dump_path.write_text(dump)
        threads = dump.split("\n\n")
        states = Counter(
            line.split("java.lang.Thread.State: ")[1].split()[0]
            for line in dump.splitlines()
            if "java.lang.Thread.State: " in line
        )
        shown = [
            "\n".join(thread.strip().splitlines()[:6])
            for thread in threads
            if "SparkConnectExecuteThread" in thread or "State: BLOCKED" in thread
        ]
        return f"connect server threads {dict(states)} (dump: {dump_path}):\n" + "\n".join(
            shown[:8]
        )
