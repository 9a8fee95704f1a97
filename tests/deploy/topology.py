"""docker-compose.yaml's deployment run as processes on this machine (no Docker engine here).

Every service's own `command` and `environment` from the compose file, interpolated with the
secrets a `.env` would hold, with each service's host name mapped to 127.0.0.1 and each port
to a free one; the container paths (/opt/cdc, /opt/airflow) mapped to the repository and a
scratch folder. Three services are stand-ins for their images: PostgreSQL 15 from
tests/postgres.py for `postgres:16`, `redis-server` from Debian for `redis:7.2`, moto's server
for MinIO (same S3 API, conditional puts included).

SPIKE, not collected by pytest: `.venv/bin/python -m tests.topology_run` starts the topology and
runs three tables' backfills through the CeleryExecutor (about 7 minutes here). It needs what only
the image has: `redis-server` (Debian) and `.venv/bin/pip install -c docker/constraints.txt
apache-airflow-providers-fab==3.10.2 apache-airflow-providers-celery==3.26.0 psycopg2-binary
asyncpg redis` (a `deploy` extra and `make system` should bring them). Still to write
(issue 26, item 1): a session fixture from this, the exact-table test, and the faults (kill -9
the Celery worker mid-rewrite, restart the Connect server, kill and restart the scheduler, stop
PostgreSQL for 30 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cdc_airflow.connect_server import free_port, port_open
from cdc_pipeline.paths import project_root
from tests import postgres, s3
from tests.helpers import stop_process_group

REPO = project_root()
COMPOSE = REPO / "docker-compose.yaml"
AIRFLOW = REPO / ".venv" / "bin" / "airflow"
# Services the test runs from the compose file's own command; the stores are stand-ins.
AIRFLOW_SERVICES = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-connect")

SECRETS = {
    "POSTGRES_PASSWORD": "pg-secret",
    "AIRFLOW_JWT_SECRET": "jwt-secret-for-the-topology-test-0123456789",
    "AIRFLOW_SECRET_KEY": "api-secret-for-the-topology-test",
    # A Fernet key (32 url-safe base64 bytes).
    "AIRFLOW_FERNET_KEY": "ZmDfcTF7_60GrrY167zsiPd67pEvs0aGOv2oasOM1Pg=",
    "AIRFLOW_ADMIN_PASSWORD": "admin-secret",
    "S3_ACCESS_KEY": "test-key",
    "S3_SECRET_KEY": "test-secret",
}

_VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(?::([?-])([^}]*))?\}")


def interpolate(text: str, values: Mapping[str, str]) -> str:
    """Compose's `${X}`, `${X:-default}`, `${X:?error}` and `$$` escapes."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        value = values.get(name, "")
        if value:
            return value
        if kind == "?":
            raise ValueError(f"compose needs {name}: {rest}")
        return rest if kind == "-" else ""

    escaped = text.replace("$$", "\0")
    return _VARIABLE.sub(one, escaped).replace("\0", "$")


def _walk(node: Any, values: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, values)
    if isinstance(node, list):
        return [_walk(item, values) for item in node]
    if isinstance(node, dict):
        return {key: _walk(value, values) for key, value in node.items()}
    return node


def services(values: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The compose file's services, anchors merged and variables interpolated."""
    document = yaml.safe_load(COMPOSE.read_text())
    return {name: _walk(spec, values) for name, spec in document["services"].items()}


@dataclass
class Topology:
    root: Path
    ports: dict[str, int] = field(default_factory=dict)  # "host:port" of the compose -> local
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the Airflow services' environment

    def port(self, host: str, port: int) -> int:
        return self.ports.setdefault(f"{host}:{port}", free_port())

    def localize(self, text: str) -> str:
        """Compose host names and ports -> 127.0.0.1 and this machine's free ports; container
        paths -> local ones."""
        for address, local in self.ports.items():
            host, port = address.split(":")
            text = text.replace(f"{host}:{port}", f"127.0.0.1:{local}")
        text = text.replace("sc://spark-connect", "sc://127.0.0.1")
        return text.replace("/opt/cdc", str(REPO)).replace("/opt/airflow", str(self.root / "home"))

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self, name: str, lines: int = 40) -> str:
        text = (self.root / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AIRFLOW), *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
        )


def _wait(what: str, ready: Any, timeout: float, topology: Topology, name: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        process = topology.processes.get(name)
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}):\n{topology.log(name)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready in {timeout} s:\n{topology.log(name)}")
        time.sleep(1)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def running(root: Path, config: Path) -> Iterator[Topology]:
    """The compose deployment as processes; stopped by their process groups."""
    root.mkdir(parents=True, exist_ok=True)
    topology = Topology(root)
    with ExitStack() as stack:
        # The stores: PostgreSQL, Redis, S3.
        pg_gen = postgres.running(postgres.scratch_root())
        pg = next(pg_gen)
        stack.callback(lambda: next(pg_gen, None))
        pg.sql(
            f"CREATE ROLE airflow LOGIN PASSWORD '{SECRETS['POSTGRES_PASSWORD']}';"
            "CREATE DATABASE airflow OWNER airflow;"
        )
        topology.ports["postgres:5432"] = pg.port
        redis_port = topology.port("redis", 6379)
        topology.start(
            "redis",
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""],
            {},
        )
        stack.callback(lambda: stop_process_group(topology.processes["redis"]))
        s3_gen = s3.running(root / "s3.log")
        s3_server = next(s3_gen)
        stack.callback(lambda: next(s3_gen, None))
        specs = services(SECRETS)
        for spec in specs.values():  # every published or addressed port gets a local one
            for address in re.findall(r"([a-z][a-z0-9-]+):(\d{4,5})\b", yaml.safe_dump(spec)):
                if address[0] not in (
                    "localhost",
                    "http",
                    "https",
                    "redis",
                    "postgres",
                    "object-store",
                ):
                    topology.port(*address[:1], int(address[1]))
        api_port = topology.port("airflow-apiserver", 8080)
        connect_port = topology.port("spark-connect", 15002)
        # The object store's variables are the S3 server's (the compose file's name MinIO's).
        compose_env = {**specs["airflow-apiserver"]["environment"], **s3_server.environment()}
        env = {k: topology.localize(str(v)) for k, v in compose_env.items()}
        env.update(
            CDC_CONFIG=str(config),
            AIRFLOW_CONN_SPARK_DEFAULT=(
                f'{{"conn_type": "spark_connect", "host": "sc://127.0.0.1", '
                f'"port": {connect_port}}}'
            ),
            # Each service of the compose file has its own container: its own ports.
            AIRFLOW__API__PORT=str(api_port),
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        )
        env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        topology.env = env
        (root / "home").mkdir(exist_ok=True)
        # airflow-init's own script.
        init = specs["airflow-init"]
        script = topology.localize(init["command"][1])
        result = subprocess.run(
            ["bash", "-euc", script],
            env={**os.environ, **env, "AIRFLOW_ADMIN_PASSWORD": SECRETS["AIRFLOW_ADMIN_PASSWORD"]},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        (root / "airflow-init.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(f"airflow-init failed:\n{result.stderr[-3000:]}")
        # Spark: master, a worker, the Connect server.
        spark_env = {
            **{
                k: topology.localize(str(v))
                for k, v in specs["spark-master"]["environment"].items()
            },
            **s3_server.environment(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(REPO / ".venv/lib/python3.11/site-packages/pyspark"),
            "SPARK_LOG_DIR": str(root / "spark-logs"),
        }
        for name in SPARK_SERVICES:
            command = specs[name]["command"]
            argv = [topology.localize(part) for part in command]
            if argv[:2] == ["bash", "-c"]:
                inner = argv[2].replace("$SPARK_HOME", spark_env["SPARK_HOME"])
                inner = inner.replace("--cores 2 --memory 4g", "--cores 2 --memory 2g")
                inner = inner.replace("--webui-port 8082", f"--webui-port {free_port()}")
                inner = inner.replace("/tmp/spark-work", str(root / name / "work"))
                inner = inner.replace(
                    "--host spark-master --port 7077",
                    f"--host 127.0.0.1 --port {topology.ports['spark-master:7077']}",
                )
                inner = inner.replace("--webui-port 8081", f"--webui-port {free_port()}")
                argv = ["bash", "-c", inner]
            argv = [
                a.replace("--host=0.0.0.0", "--host=127.0.0.1")
                .replace("spark.driver.host=spark-connect", "spark.driver.host=127.0.0.1")
                .replace("bindAddress=0.0.0.0", "bindAddress=127.0.0.1")
                .replace("--port=15002", f"--port={connect_port}")
                for a in argv
            ]
            if name == "spark-connect":
                argv = [str(REPO / ".venv/bin/python"), *argv[1:]]
            topology.start(name, argv, {**spark_env, "CDC_CONFIG": str(config)})
            stack.callback(lambda n=name: stop_process_group(topology.processes[n]))
            if name == "spark-master":
                _wait(
                    "spark master",
                    lambda: port_open("127.0.0.1", topology.ports["spark-master:7077"]),
                    120,
                    topology,
                    name,
                )
        _wait(
            "spark connect",
            lambda: port_open("127.0.0.1", connect_port),
            300,
            topology,
            "spark-connect",
        )
        # Airflow's services, each with the compose file's command.
        for name in AIRFLOW_SERVICES:
            argv = [topology.localize(part) for part in specs[name]["command"]]
            argv = [str(AIRFLOW) if a == "airflow" else a for a in argv]
            if name == "airflow-apiserver":
                argv = [a if a != "0.0.0.0" else "127.0.0.1" for a in argv]
                argv[argv.index("--port") + 1] = str(api_port)
            topology.start(name, argv, env)
            stack.callback(lambda n=name: stop_process_group(topology.processes[n]))
        _wait(
            "api-server",
            lambda: _http_ok(f"http://127.0.0.1:{api_port}/api/v2/monitor/health"),
            300,
            topology,
            "airflow-apiserver",
        )
        yield topology
