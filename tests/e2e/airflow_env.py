"""The e2e tests' Airflow: the project's LocalAirflow plus REST helpers."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from cdc_pipeline.local_airflow import BIN, LocalAirflow, free_port

__all__ = ["BIN", "AirflowEnv", "free_port"]


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
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["access_token"])

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/v2{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token()}"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
