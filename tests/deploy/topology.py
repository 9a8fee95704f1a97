"""docker-compose.yaml's deployment run as processes on this machine (no Docker engine here).

Every service's own `command` and `environment` from the compose file, interpolated with the
secrets a `.env` would hold, with each service's host name mapped to 127.0.0.1 and each port
to a free one; the container paths (/opt/cdc, /opt/airflow) mapped to the repository and a
scratch folder; the image's Python environment is `.tools/deploy` (make: the project and its
`deploy` extra under docker/constraints.txt, as the Dockerfile installs them). Three services
are stand-ins for their images: PostgreSQL 15 from tests/postgres.py for `postgres:16`,
`redis-server` from Debian for `redis:7.2`, moto's server for MinIO (same S3 API, conditional
puts included). Every service of the project image is restarted when it exits, as the file's
`restart: unless-stopped` has Docker do.

What this cannot show: the image itself (its Debian packages, user 50000, file modes), the
host's volumes and the compose network's DNS; `docker-compose config` and the parsed-file tests
(tests/repo/test_compose.py) keep those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from cdc_airflow.local.connect_server import free_port, port_open
from cdc_airflow.local.launcher import rest_call
from cdc_pipeline.paths import project_root
from tests import postgres, s3
from tests.helpers import stop_process_group

REPO = project_root()
COMPOSE = REPO / "docker-compose.yaml"
DEPLOY = REPO / ".tools" / "deploy"  # the image's Python environment (Makefile)
AIRFLOW = DEPLOY / "bin" / "airflow"
PYTHON = DEPLOY / "bin" / "python"
SPARK_HOME = DEPLOY / "lib" / "python3.11" / "site-packages" / "pyspark"
# Services the test runs from the compose file's own command; the stores are stand-ins.
AIRFLOW_SERVICES = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2", "spark-connect")
# What the test changes in the file's settings, and why (Airflow's defaults would have it wait
# 5 and 10 minutes per fault): a Celery worker killed with -9 leaves its task "running" until
# the scheduler misses its heartbeats for this long (default 300 s); a task handed to the worker
# as the metadata database went away stays "queued" (the worker could not record it) until this
# timeout requeues it (default 600 s; seen with PostgreSQL stopped for 30 s).
TEST_SETTINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "45",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "60",
}

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
class Service:
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    restart: bool  # the file's `restart: unless-stopped`
    restarts: int = 0
    held: bool = False  # stopped on purpose (`docker stop`): not restarted


@dataclass
class Topology:
    root: Path
    pg: postgres.Postgres | None = None
    ports: dict[str, int] = field(default_factory=dict)  # "host:port" of the compose -> local
    services: dict[str, Service] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the Airflow services' environment
    lock: threading.Lock = field(default_factory=threading.Lock)

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

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        return subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, name: str, argv: list[str], env: Mapping[str, str], restart: bool) -> None:
        with self.lock:
            self.services[name] = Service(argv, dict(env), self._spawn(name, argv, env), restart)

    def kill(self, name: str) -> None:
        """kill -9 the service as `docker kill` kills its container: every process it started,
        also those in process groups of their own (Airflow's task runners); the restart policy
        starts it again."""
        process = self.services[name].process
        descendants = _descendants(process.pid)
        os.killpg(process.pid, signal.SIGKILL)
        _kill_all(descendants)

    def stop(self, name: str) -> None:
        """`docker stop`: SIGTERM, then SIGKILL, then whatever of the container is left; not
        restarted until `start_again`."""
        with self.lock:
            service = self.services[name]
            service.held = True
        _stop_tree(service.process)

    def start_again(self, name: str) -> None:
        with self.lock:
            service = self.services[name]
            service.process = self._spawn(name, service.argv, service.env)
            service.held = False

    def supervise(self) -> None:
        """`restart: unless-stopped`: a service of the project image that exits is started
        again (Docker waits 100 ms, doubling; 1 s here)."""
        with self.lock:
            for name, service in self.services.items():
                if service.restart and not service.held and service.process.poll() is not None:
                    with (self.root / f"{name}.log").open("a") as log:
                        log.write(f"\n--- exited {service.process.returncode}: restarted ---\n")
                    service.process = self._spawn(name, service.argv, service.env)
                    service.restarts += 1

    def stop_all(self) -> None:
        with self.lock:
            for service in self.services.values():
                service.held = True
        for service in reversed(list(self.services.values())):
            _stop_tree(service.process)

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

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The api-server's REST answer as the admin user: what the UI and a user's scripts call,
        without an Airflow CLI start (10-20 s on a loaded machine) per call."""
        url = f"http://127.0.0.1:{self.ports['airflow-apiserver:8080']}"
        return rest_call(url, SECRETS["AIRFLOW_ADMIN_PASSWORD"], method, path, body)

    def metadata(self, query: str) -> list[dict[str, Any]]:
        """Rows of Airflow's metadata database (what the api-server would answer, read directly:
        one psql call instead of an Airflow CLI start per poll)."""
        assert self.pg is not None
        return dataclasses.replace(self.pg, database="airflow").rows(query)


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stop_tree(process: subprocess.Popen[bytes]) -> None:
    """A service's process group stopped, then any process it started elsewhere killed."""
    descendants = _descendants(process.pid)
    stop_process_group(process)
    _kill_all(descendants)


def _wait(what: str, ready: Any, timeout: float, topology: Topology, name: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        service = topology.services.get(name)
        if service is not None and service.process.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{topology.log(name)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready in {timeout} s:\n{topology.log(name)}")
        time.sleep(2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _healthy(argv: list[str], env: Mapping[str, str]) -> bool:
    """A compose healthcheck's command (CMD form) exits 0."""
    result = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, timeout=120, check=False, cwd=REPO
    )
    return result.returncode == 0


def _spark_argv(topology: Topology, name: str, command: list[str], connect_port: int) -> list[str]:
    """A Spark service's command on this machine: its ports free ones, its work folder a
    scratch one, half the memory (the two workers share 2 cores and this machine's RAM)."""
    argv = [topology.localize(part) for part in command]
    if argv[:2] == ["bash", "-c"]:
        inner = argv[2].replace("$SPARK_HOME", str(SPARK_HOME))
        inner = inner.replace("--cores 2 --memory 4g", "--cores 2 --memory 2g")
        inner = inner.replace("/tmp/spark-work", str(topology.root / name / "work"))
        inner = inner.replace(
            "--host spark-master --port 7077",
            f"--host 127.0.0.1 --port {topology.ports['spark-master:7077']}",
        )
        inner = re.sub(r"--webui-port \d+", f"--webui-port {free_port()}", inner)
        argv = ["bash", "-c", inner]
    argv = [
        a.replace("--host=0.0.0.0", "--host=127.0.0.1")
        .replace("spark.driver.host=spark-connect", "spark.driver.host=127.0.0.1")
        .replace("bindAddress=0.0.0.0", "bindAddress=127.0.0.1")
        .replace("--port=15002", f"--port={connect_port}")
        for a in argv
    ]
    return [str(PYTHON) if a == "python" else a for a in argv]


@contextmanager
def running(root: Path, config: Path) -> Iterator[Topology]:
    """The compose deployment as processes, supervised; stopped by their process groups."""
    root.mkdir(parents=True, exist_ok=True)
    topology = Topology(root)
    with ExitStack() as stack:
        # The stores: PostgreSQL, Redis, S3.
        pg_gen = postgres.running(postgres.scratch_root())
        topology.pg = pg = next(pg_gen)
        stack.callback(lambda: next(pg_gen, None))
        pg.sql(
            f"CREATE ROLE airflow LOGIN PASSWORD '{SECRETS['POSTGRES_PASSWORD']}';"
            "CREATE DATABASE airflow OWNER airflow;"
        )
        topology.ports["postgres:5432"] = pg.port
        redis_port = topology.port("redis", 6379)
        redis = ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""]
        topology.start("redis", redis, {}, restart=False)
        s3_gen = s3.running(root / "s3.log")
        s3_server = next(s3_gen)
        stack.callback(lambda: next(s3_gen, None))
        stack.callback(topology.stop_all)  # first of the three: before the stores go
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
        # The compose file's spark_default, its port this machine's.
        connection = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
        connection["port"] = connect_port
        env.update(
            AIRFLOW_CONN_SPARK_DEFAULT=json.dumps(connection),
            CDC_CONFIG=str(config),
            # Each service of the compose file has its own container: its own ports.
            AIRFLOW__API__PORT=str(api_port),
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            **TEST_SETTINGS,
        )
        env["PATH"] = f"{DEPLOY / 'bin'}{os.pathsep}{os.environ['PATH']}"
        topology.env = env
        (root / "home").mkdir(exist_ok=True)
        # airflow-init's own script, while the Spark services start (neither waits for the
        # other in the file).
        script = topology.localize(specs["airflow-init"]["command"][1])
        init_env = {**env, "AIRFLOW_ADMIN_PASSWORD": SECRETS["AIRFLOW_ADMIN_PASSWORD"]}
        init = topology._spawn("airflow-init", ["bash", "-euc", script], init_env)
        stack.callback(lambda: stop_process_group(init))
        # Spark: the master, two workers, the Connect server as the cluster's driver.
        spark_env = {
            **{
                k: topology.localize(str(v))
                for k, v in specs["spark-master"]["environment"].items()
            },
            **s3_server.environment(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOG_DIR": str(root / "spark-logs"),
            "PATH": env["PATH"],
            "CDC_CONFIG": str(config),
        }
        for name in SPARK_SERVICES:
            argv = _spark_argv(topology, name, specs[name]["command"], connect_port)
            topology.start(name, argv, spark_env, restart=True)
            if name == "spark-master":
                _wait(
                    "spark master",
                    lambda: port_open("127.0.0.1", topology.ports["spark-master:7077"]),
                    120,
                    topology,
                    name,
                )
        if init.wait(timeout=600) != 0:
            raise RuntimeError(f"airflow-init failed:\n{topology.log('airflow-init')}")
        # The Connect server's own healthcheck: healthy when a query runs on the executors.
        probe = [topology.localize(part) for part in specs["spark-connect"]["healthcheck"]["test"]]
        probe = [str(PYTHON) if a == "python" else a for a in probe[1:]]
        probe = [a.replace("127.0.0.1:15002", f"127.0.0.1:{connect_port}") for a in probe]
        _wait("spark connect", lambda: _healthy(probe, spark_env), 300, topology, "spark-connect")
        # Airflow's services, each with the compose file's command.
        for name in AIRFLOW_SERVICES:
            argv = [topology.localize(part) for part in specs[name]["command"]]
            argv = [str(AIRFLOW) if a == "airflow" else a for a in argv]
            if name == "airflow-apiserver":
                argv = [a if a != "0.0.0.0" else "127.0.0.1" for a in argv]
                argv[argv.index("--port") + 1] = str(api_port)
            topology.start(name, argv, env, restart=True)
        _wait(
            "api-server",
            lambda: _http_ok(f"http://127.0.0.1:{api_port}/api/v2/monitor/health"),
            300,
            topology,
            "airflow-apiserver",
        )
        stopped = threading.Event()

        def supervisor() -> None:
            while not stopped.wait(1):
                topology.supervise()

        thread = threading.Thread(target=supervisor, daemon=True)
        thread.start()
        stack.callback(thread.join)
        stack.callback(stopped.set)
        yield topology
