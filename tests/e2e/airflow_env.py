"""The e2e tests' Airflow: the project's LocalAirflow plus REST helpers."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from cdc_airflow.connect_server import free_port
from cdc_airflow.local import BIN, LocalAirflow

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
