"""Run by hand (a spike, not collected by pytest): the compose services as processes
(tests/topology.py), three tables landed on S3 and backfilled through the CeleryExecutor, each
final compared with the expected rows. `.venv/bin/python -m tests.topology_run [ROOT]`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_pipeline.paths import ObjectPath
from tests.e2e.test_airflow import land_hours, row
from tests.helpers import Workspace, table_rows
from tests.topology import Topology, running

TABLES = ["t1", "t2", "t3"]
AWS = (
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
)


def runs(topology: Topology, dag: str) -> list[dict[str, Any]]:
    out = topology.airflow("dags", "list-runs", dag, "-o", "json").stdout
    lines = [line for line in out.splitlines() if line.startswith("[{") or line.strip() == "[]"]
    return list(json.loads(lines[-1])) if lines else []


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))  # stop the services on a kill too
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/cdc-topology")
    shutil.rmtree(root, ignore_errors=True)
    (root / "ws").mkdir(parents=True)
    ws = Workspace(root / "ws", ObjectPath("cdc", ""))
    ws.config_path.write_text(yaml.safe_dump({"tables": [row(t) for t in TABLES]}))
    started = time.time()
    with running(root / "run", ws.config_path) as topology:
        print("up after", round(time.time() - started), "s", flush=True)
        os.environ.update({k: topology.env[k] for k in AWS})
        expected = {t: land_hours(ws, t, 2) for t in TABLES}
        for t in TABLES:
            for args in (
                ("dags", "unpause", f"cdc_{t}"),
                (
                    "backfill",
                    "create",
                    "--dag-id",
                    f"cdc_{t}",
                    "--from-date",
                    "2024-01-01T00:00:00+00:00",
                    "--to-date",
                    "2024-01-01T01:00:00+00:00",
                ),
            ):
                result = topology.airflow(*args)
                assert result.returncode == 0, (args, result.stderr[-2000:])
        deadline = time.time() + 900
        while time.time() < deadline:
            states = {t: [r["state"] for r in runs(topology, f"cdc_{t}")] for t in TABLES}
            print(round(time.time() - started), states, flush=True)
            if all(len(s) >= 2 and set(s) <= {"success", "failed"} for s in states.values()):
                break
            time.sleep(20)
        exact = True
        for t in TABLES:
            got = table_rows(ws.paths(t).final, ["ID", "VALUE"])
            print(t, "exact" if got == expected[t] else f"differs: {got} != {expected[t]}")
            exact = exact and got == expected[t]
        print("done after", round(time.time() - started), "s", flush=True)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
