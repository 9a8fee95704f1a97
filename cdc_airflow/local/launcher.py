"""A local Airflow 3 (SQLite, LocalExecutor) for `make demo`, `make airflow` and the e2e tests.

Its services run in their own process groups and are stopped by their own pids.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cdc_airflow.dag_files import write_dag_files
from cdc_airflow.local.connect_server import ConnectServer, free_port
from cdc_airflow.local.connect_server import start as start_connect_server
from cdc_airflow.local.home import HomeInUseError, claim_home, default_home
from cdc_pipeline.jvm import connect_address
from cdc_pipeline.paths import Location, source_checkout

BIN = Path(sys.executable).parent
LOCAL_SPARK = '{"conn_type": "spark", "host": "local[2]"}'  # spark-submit mode


def connect_connection(port: int, host: str = "127.0.0.1") -> str:
    """A `spark_connect` Airflow connection (JSON) to a Connect server on host:port."""
    return json.dumps({"conn_type": "spark_connect", "host": host, "port": port})


def spark_connection_from_environment() -> str | None:
    """spark_default as the user's environment asks: `AIRFLOW_CONN_SPARK_DEFAULT` as it is, or
    a spark_connect connection to `CDC_SPARK_REMOTE`; None: start a local Connect server."""
    given = os.environ.get("AIRFLOW_CONN_SPARK_DEFAULT")
    if given:
        return given
    remote = os.environ.get("CDC_SPARK_REMOTE")
    if remote:
        host, port = connect_address(remote)
        return connect_connection(port, host)
    return None


# Airflow's api-server listens on every interface by default; a laptop on a shared network
# would expose the UI (and its admin password prompt). Loopback unless CDC_AIRFLOW_HOST says.
DEFAULT_HOST = "127.0.0.1"
TASK_PROCESSES = 2  # tasks running at once: the machine's 2 cores (the steps are CPU-bound)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
_ERROR_LINE = re.compile(r"\bERROR\b|Error:|Exception:|Traceback|error: ")


def default_host() -> str:
    """The api-server's bind address: CDC_AIRFLOW_HOST, else the loopback interface."""
    return os.environ.get("CDC_AIRFLOW_HOST") or DEFAULT_HOST


def write_private(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only (0600), atomically.

    The file is created 0600 before any byte is written (never briefly world-readable, whatever
    the umask) and renamed into place, so a reader sees the old file or the whole new one.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def pool_name(table_name: str) -> str:
    """The Airflow pool of a table's tasks: one slot, so its Spark steps never run side by side."""
    return f"cdc_{table_name}"


def table_pools(config: Path | None = None) -> dict[str, dict[str, Any]]:
    """One pool per valid config row (`cdc_<name>`, 1 slot), as `airflow pools import` reads them.

    Also `python -m cdc_airflow.local.launcher --print-pools` (the compose init service).
    """
    from cdc_pipeline.config import load_table_configs

    return {
        pool_name(name): {
            "slots": 1,
            "description": f"CDC table {name}: one Spark step of the table at a time",
        }
        for name in sorted(load_table_configs(config).tables)
    }


def json_rows(output: str) -> list[dict[str, Any]]:
    """The JSON list an airflow command printed, after any warning lines it printed first."""
    for line in output.splitlines():
        if line.startswith(("[{", "[]")):
            return list(json.loads(line))
    raise RuntimeError(f"no JSON list in: {output[-2000:]}")


def rest_call(
    url: str, password: str, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """One call of the REST API v2 of the api-server at `url` as its admin user, with a token of
    its own; the JSON answer."""
    token_request = urllib.request.Request(
        f"{url}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(token_request, timeout=120) as response:
        token = json.loads(response.read())["access_token"]
    request = urllib.request.Request(
        f"{url}/api/v2{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@dataclass
class LocalAirflow:
    """An Airflow home with a given CDC config and data roots, reading the checkout's dags/ and
    plugins/, or (the package installed) the DAG files it writes into its home's dags/."""

    home: Path
    config: Path
    landing: Location
    warehouse: Location
    # spark_default: None (the default) is Spark Connect mode: this object starts a local Connect
    # server (start_spark) and spark_default points at it; a JSON connection is used as it is.
    spark_connection: str | None = None
    port: int = field(default_factory=free_port)
    log_dir: Path | None = None
    host: str = field(default_factory=default_host)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    connect_port: int = field(default_factory=free_port)
    connect_master: str = "local[2]"
    connect_server: ConnectServer | None = None

    @property
    def spark_default(self) -> str:
        """The spark_default connection: the given one, else the local Connect server's."""
        return self.spark_connection or connect_connection(self.connect_port)

    def start_spark(self, *, wait: bool = True) -> None:
        """In Connect mode, start the local Spark Connect server (once); with `wait`, return once
        it answers (else `wait_for_spark` later: the JVM starts while other work goes on)."""
        if self.spark_connection is None and self.connect_server is None:
            logs = self.log_dir or self.home / "logs"
            self.connect_server = start_connect_server(
                self.connect_port,
                master=self.connect_master,
                log_path=logs / "spark-connect.log",
                wait=False,
            )
        if wait:
            self.wait_for_spark()

    def wait_for_spark(self, timeout: float = 180) -> None:
        """Wait until the local Connect server (if this object started one) answers a query."""
        if self.connect_server is not None:
            self.connect_server.wait_ready(timeout)

    def stop_spark(self) -> None:
        """Stop the local Connect server, if this object started one."""
        server, self.connect_server = self.connect_server, None
        if server is not None:
            server.stop()

    @property
    def url(self) -> str:
        """Where clients reach the api-server (loopback when it listens on every interface)."""
        host = DEFAULT_HOST if self.host in WILDCARD_HOSTS else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def passwords_file(self) -> Path:
        return self.home / "passwords.json"

    def admin_password(self) -> str:
        """The admin's password (written at the first migrate)."""
        return str(json.loads(self.passwords_file.read_text())["admin"])

    @property
    def dags_folder(self) -> Path:
        """The checkout's dags/; installed, dags/ in the home (`migrate` writes its files)."""
        checkout = source_checkout()
        return checkout / "dags" if checkout is not None else self.home / "dags"

    @property
    def plugins_folder(self) -> Path:
        """The checkout's plugins/, else the home's (the view comes by its entry point)."""
        checkout = source_checkout()
        return checkout / "plugins" if checkout is not None else self.home / "plugins"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.dags_folder),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(self.plugins_folder),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            # SQLite allows one writer: wait up to 60 s for a lock instead of failing at once.
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{self.home}/airflow.db?timeout=60",
            # LocalExecutor, its workers forked with the task code imported (cdc_airflow/local/executor.py)
            AIRFLOW__CORE__EXECUTOR="cdc_airflow.local.executor.PreloadingLocalExecutor",
            # 2 task processes (2 cores: more only contend), each with a task queued behind it
            # that starts when it is free, not at the scheduler's next loop (cdc_airflow/local/executor.py)
            AIRFLOW__CORE__PARALLELISM=str(2 * TASK_PROCESSES),
            AIRFLOW__CDC__TASK_PROCESSES=str(TASK_PROCESSES),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.url}/execution/",
            AIRFLOW__API__HOST=self.host,
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__BASE_URL=self.url,
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(self.passwords_file),
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
            # A task's supervisor heartbeats every `[workers] min_heartbeat_interval` (5 s): it once
            # also noticed its process's exit only then, so this was 1 s; the executor now sees the
            # exit at once (cdc_airflow/local/executor.py), and a 1 s heartbeat was an API call and
            # a database write more per second of every task.
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="30",
            AIRFLOW_CONN_SPARK_DEFAULT=self.spark_default,
            CDC_CONFIG=str(self.config),
            CDC_LANDING=str(self.landing),
            CDC_WAREHOUSE=str(self.warehouse),
            SPARK_LOCAL_IP="127.0.0.1",
        )
        env.pop("CDC_SPARK_MASTER", None)
        env.setdefault("CDC_SHUFFLE_PARTITIONS", "4")
        return env

    def airflow(
        self, *args: str, timeout: int = 900, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run an airflow CLI command against this installation.

        A command that lost SQLite's single write lock to the scheduler ("database is locked")
        made no change and is run again, up to three times.
        """
        for attempt in range(1, 4):
            result = subprocess.run(
                [str(BIN / "airflow"), *args],
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            locked = "database is locked" in result.stderr + result.stdout
            if result.returncode == 0 or not locked or attempt == 3:
                break
            time.sleep(2 * attempt)
        if check and result.returncode != 0:
            output = result.stdout + "\n" + result.stderr
            # The first errors say why; the tail only that the run failed (a `dags test` prints
            # every task's log, so the failing task's lines scroll far above the end).
            errors = [line for line in output.splitlines() if _ERROR_LINE.search(line)][:40]
            first = errors[0][:300] if errors else f"exit {result.returncode}"
            raise RuntimeError(
                f"airflow {' '.join(args)} failed: {first}\nits error lines:\n"
                + "\n".join(line[:500] for line in errors)
                + f"\nthe end of its output:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def migrate(self) -> None:
        """Create or upgrade the metadata DB and the tables' pools; the admin password is generated once.

        The home holds the password file, the SQLite DB (connections) and the generated
        airflow.cfg (secret keys): it is the owner's only (0700), the password file 0600.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o700)
        if not self.passwords_file.exists():
            write_private(self.passwords_file, json.dumps({"admin": secrets.token_urlsafe(12)}))
        self.passwords_file.chmod(0o600)  # a file left by an older version may be 0644
        if source_checkout() is None:
            write_dag_files(self.dags_folder)
            self.plugins_folder.mkdir(exist_ok=True)
        self.airflow("db", "migrate")
        self.create_pools()

    def create_pools(self) -> None:
        """Create or update the tables' pools in one `airflow pools import` (one process)."""
        pools = table_pools(self.config)
        if not pools:
            return
        pools_file = self.home / "cdc_pools.json"
        pools_file.write_text(json.dumps(pools, indent=1))
        self.airflow("pools", "import", str(pools_file))

    def api_server_command(self) -> list[str]:
        """The api-server's command line: bound to `host` (Airflow's default is every interface)."""
        return [str(BIN / "airflow"), "api-server", "--host", self.host, "--port", str(self.port)]

    def start(self, *component: str) -> None:
        """Start a component (api-server, scheduler, dag-processor) in its own process group."""
        logs = self.log_dir or self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"{component[0]}.log").open("ab")
        command = (
            self.api_server_command()
            if component == ("api-server",)
            else [str(BIN / "airflow"), *component]
        )
        process = subprocess.Popen(
            command,
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)

    def start_services(self, *, wait: bool = True, scheduler: bool = True) -> None:
        """The Spark Connect server (Connect mode), api-server (tasks report to its execution
        API), scheduler and dag-processor; with `wait`, return once Spark and the API answer.

        Without `scheduler`, the caller starts it (`start("scheduler")`) once it has queued its
        runs: on SQLite, a backfill created through the API while the scheduler writes can fail
        ("Backfill creation is not supported on SQLite under concurrent access", Airflow's 503)
        or wait out the lock timeout with every other writer behind it."""
        self.start_spark(wait=False)
        self.start("api-server")
        if scheduler:
            self.start("scheduler")
        self.start("dag-processor")
        if wait:
            self.wait_for_spark()
            self.wait_for_api()

    def wait_for_api(self, timeout: float = 180) -> None:
        """Wait until the api-server answers, then until its execution API (where task processes
        report) has answered once too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError(f"the api-server did not answer on {self.url}")
        # The execution API builds its versioned routes on its first request (Cadwyn: 2-3.5 s of
        # this machine's CPU): made here, the first tasks of a run do not wait for it.
        try:
            with urllib.request.urlopen(f"{self.url}/execution/health", timeout=60):
                pass
        except OSError as error:  # the tasks' own first request builds them instead
            print(f"the execution API did not answer its health check: {error}", file=sys.stderr)

    def wait_for_dags(
        self, dag_ids: Collection[str], timeout: float = 180, *, with_next_run: bool = False
    ) -> dict[str, datetime | None]:
        """Wait until the dag-processor has serialized every DAG in `dag_ids` (it parses the DAG
        folder when it starts), and with `with_next_run` until each has its next scheduled run;
        returns each DAG's next run. A DAG file that fails to import is reported at once."""
        from cdc_airflow.local.runs import MetadataDB

        db = MetadataDB(self.home / "airflow.db")
        deadline = time.monotonic() + timeout
        missing = sorted(dag_ids)
        while time.monotonic() < deadline:
            try:
                found = db.next_dagruns(dag_ids)
                errors = db.import_errors()
            except Exception:  # the tables are being created or written: ask again
                found, errors = {}, []
            if errors:
                raise RuntimeError(f"the DAG files do not import: {'; '.join(errors)}")
            ready = {d for d, run in found.items() if run is not None or not with_next_run}
            missing = sorted(set(dag_ids) - ready)
            if not missing:
                return found
            time.sleep(1)
        raise RuntimeError(
            f"{len(missing)} DAG(s) not parsed within {timeout:.0f} s: {', '.join(missing[:5])} "
            f"(logs: {self.log_dir or self.home / 'logs'})"
        )

    def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A REST API v2 call as admin, retried on a server error: when the scheduler is busy the
        api-server's SQLite may answer 500 ("database is locked") for a moment."""
        for attempt in range(1, 7):
            try:
                return self.rest_once(method, path, body)
            except urllib.error.HTTPError as error:
                if error.code < 500 or attempt == 6:
                    raise
            except urllib.error.URLError:
                if attempt == 6:
                    raise
            time.sleep(2.0 * attempt)
        raise AssertionError("unreachable")

    def rest_once(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One REST API v2 call as admin (a token per call: these are a few calls per run)."""
        return rest_call(self.url, self.admin_password(), method, path, body)

    def stop(self) -> None:
        """Stop what this object started, by process group."""
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
        self.stop_spark()

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return json_rows(self.airflow("dags", "list-runs", dag_id, "-o", "json").stdout)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        rows = json_rows(
            self.airflow("tasks", "states-for-dag-run", dag_id, run_id, "-o", "json").stdout
        )
        return {row["task_id"]: row["state"] for row in rows}

    def wait_for_runs(
        self, dag_id: str, count: int, prefix: str = "", timeout: float = 1800
    ) -> list[dict[str, Any]]:
        """Wait until `count` runs whose run_id starts with `prefix` have finished."""
        deadline = time.monotonic() + timeout
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            runs = [
                r
                for r in self.runs(dag_id)
                if r["state"] in ("success", "failed") and r["run_id"].startswith(prefix)
            ]
            if len(runs) >= count:
                return runs
            time.sleep(5)
        raise RuntimeError(
            f"{dag_id}: {len(runs)} of {count} runs finished in time (logs: {self.home})"
        )


def serve() -> int:
    """`make airflow`: the full local Airflow (UI) on the repo's config until Ctrl-C."""
    parser = argparse.ArgumentParser(prog="make airflow")
    parser.add_argument("--port", type=int, default=int(os.environ.get("CDC_AIRFLOW_PORT", "8080")))
    parser.add_argument(
        "--host",
        default=default_host(),
        help="address the api-server binds (default CDC_AIRFLOW_HOST or 127.0.0.1; "
        "0.0.0.0 exposes it to the network)",
    )
    parser.add_argument(
        "--print-pools",
        action="store_true",
        help="print the tables' pools as `airflow pools import` JSON and exit",
    )
    args = parser.parse_args()
    if args.print_pools:
        print(json.dumps(table_pools(), indent=1))
        return 0
    from cdc_pipeline.config import default_config_path
    from cdc_pipeline.paths import landing_root, warehouse_root

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Ctrl-C, and a plain `kill`, both stop the components this process started.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    local = LocalAirflow(
        default_home(),  # the demo's too: its runs show here
        default_config_path(),
        landing_root(),
        warehouse_root(),
        port=args.port,
        host=args.host,
        spark_connection=spark_connection_from_environment(),
    )
    try:
        with claim_home(local.home, by=f"make airflow on {local.url}"):
            local.migrate()
            return run_until_stopped(local)
    except HomeInUseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def run_until_stopped(local: LocalAirflow) -> int:
    """Start the services and wait for Ctrl-C (0), or for a component to exit (1); stop them."""
    try:
        # Inside the try: a component that does not come up stops the ones already started.
        local.start_services()
        print(
            f"Airflow UI: {local.url}  (user admin, password {local.admin_password()}; in {local.passwords_file})"
        )
        if local.connect_server is not None:
            print(
                f"Spark Connect server: {local.connect_server.url} (spark_default; log {local.connect_server.log_path})"
            )
        else:
            print(f"spark_default: {local.spark_default}")
        print("Ctrl-C stops it.", flush=True)
        while all(p.poll() is None for p in local.processes):
            time.sleep(2)
        print("an Airflow component exited; see the logs in", local.home / "logs", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        local.stop()


if __name__ == "__main__":
    sys.exit(serve())
