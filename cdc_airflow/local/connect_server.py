"""A local Spark Connect server from the pip package: start, wait until it answers, stop by pid.

One warm Spark for every step: `make airflow`, `make demo` and the tests start it here, and the
steps connect to it as thin clients (`sc://127.0.0.1:PORT`) instead of starting a JVM each.
`python -m cdc_airflow.local.connect_server --port 15002` runs one in the foreground.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cdc_airflow.local.connect_driver import WARM_UP_CONF
from cdc_pipeline.jvm import CONNECT_DEFAULT_PORT, CONNECT_SERVER_MEMORY, utf8_locale

# The server is Spark's Connect plugin on a driver of our own (connect_driver.py), not Spark's
# server class, which forces per-session artifact isolation (see connect_driver's docstring).
PLUGIN_CLASS = "org.apache.spark.sql.connect.SparkConnectPlugin"
DRIVER_PROGRAM = Path(__file__).with_name("connect_driver.py")
DEFAULT_PORT = CONNECT_DEFAULT_PORT
BIND_ADDRESS = "127.0.0.1"
# Concurrent tasks of different tables share the server: FAIR scheduling lets a small job of
# one table run beside a long one of another instead of queueing behind it (FIFO).
SERVER_ONLY_CONF = {
    "spark.scheduler.mode": "FAIR",
    # A client that vanished (killed task) leaves its session; drop idle ones after 30 min.
    "spark.connect.session.manager.defaultSessionTimeout": "30min",
    "spark.plugins": PLUGIN_CLASS,
    # Client sessions share the driver's classloader (they add no jars or classes), so code Spark
    # generated and compiled for one task's query serves the next task's same query.
    "spark.sql.artifact.isolation.enabled": "false",
    "spark.sql.artifact.isolation.alwaysApplyClassloader": "false",
    # Compiled classes kept: a table's stage and overwrite-final compile about 75, so Spark's
    # default 100 holds not even two tables' and a cycle through more tables than the cache
    # holds evicts every class before its next use. 8192: about 100 tables of distinct schemas.
    "spark.sql.codegen.cache.maxEntries": "8192",
    # HotSpot's optimising compiler (C2) later: a long-lived server's steps call Spark's planner,
    # Connect and Parquet code a few times each, so by the default thresholds thousands of
    # methods reach C2 over hundreds of runs, each compiled at great cost for a method that
    # is warm, not hot: over runs 16-40 of one table, the compiler threads took 28.5 of the
    # server's 62.7 CPU-s. Eight times the thresholds leave those at C1 and still give C2 the
    # loops that read and write rows (a back edge counted per row): 8.5 of 39.4 CPU-s
    # (docs/performance-log.md).
    # And G1's regions 16 MB, not the 1 MB it picks for a 2 GB heap: G1 puts an object of half a
    # region or more in old-generation regions of its own and may start a concurrent marking
    # for it, and a step makes many such short-lived buffers (a 4 MB chunk per broadcast, about
    # 1 MB for a task binary, a hash join's page, a Parquet compressor). Over 40 runs of a warm
    # server the collector's threads took 11-23% of its CPU with 1 MB regions, 4% with 16 MB,
    # and the server 16% less CPU in all. The driver's default options: a user's
    # `spark.driver.extraJavaOptions` comes after them and wins.
    "spark.driver.defaultJavaOptions": (
        "-XX:Tier4InvocationThreshold=40000 -XX:Tier4MinInvocationThreshold=4800"
        " -XX:Tier4CompileThreshold=120000 -XX:Tier4BackEdgeThreshold=320000"
        " -XX:G1HeapRegionSize=16m"
    ),
}


# `false` in the environment of whatever starts a local server (`make airflow`, the launcher, the
# tests) switches its warm-up off, as the server's `spark.cdc.warmUp=false` does.
WARM_UP_ENV = "CDC_CONNECT_WARM_UP"


class ConnectServerError(RuntimeError):
    """The Spark Connect server did not start or does not answer."""


def spark_home() -> Path:
    """The pip package's Spark (bin/, jars/ with the spark-connect jar)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConnectServerError("pyspark is not installed in this Python")
    home = Path(spec.origin).parent
    if not (home / "jars").is_dir():  # pyspark-client only: the light install
        raise ConnectServerError(
            "the Spark Connect server needs the full pyspark (this install has only the Connect "
            "client, pyspark-client): install `cdc-lakehouse[spark]`"
        )
    return home


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind((BIND_ADDRESS, 0))
        return int(sock.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def check_query(url: str) -> None:
    """Run a trivial query through a Connect session of `url`; raise when it fails.

    Uses the Connect session class directly, so a process that also holds a classic session
    (the tests) is not switched to Connect mode by the check.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).create()
    try:
        rows = session.sql("SELECT 1 AS ok").collect()
        if [tuple(r) for r in rows] != [(1,)]:
            raise ConnectServerError(f"{url}: unexpected answer to SELECT 1: {rows}")
    finally:
        session.stop()


def check_executors(url: str) -> None:
    """Run a query whose tasks need executors (a cluster's workers), not only the driver: the
    compose healthcheck, so a server whose workers are gone is unhealthy, not a healthy port."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(url).create()
    try:
        rows = session.range(0, 4, 1, 2).selectExpr("sum(id) AS total").collect()
        if [tuple(r) for r in rows] != [(6,)]:
            raise ConnectServerError(f"{url}: unexpected answer to sum(0..3): {rows}")
    finally:
        session.stop()


def _die_with_parent() -> None:
    """In the child before exec: Linux sends it SIGTERM when its parent dies (PR_SET_PDEATHSIG),
    so a launcher or test run that is killed without cleaning up leaves no server behind."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def server_conf(
    port: int,
    conf: Mapping[str, str] | None = None,
    host: str = BIND_ADDRESS,
    master: str = "local[2]",
) -> dict[str, str]:
    """The server's Spark settings: the steps' JVM settings, the bind address, FAIR, `conf` last
    (its `spark.plugins` added to the Connect plugin, not in its place)."""
    from spark_jobs.runtime.session import REQUIRED_SQL_CONF, driver_classpath, static_conf

    settings = {
        # A larger heap than Spark's 1g (cdc_pipeline.jvm says why); CDC_SPARK_DRIVER_MEMORY
        # (static_conf's) or `conf` wins.
        "spark.driver.memory": CONNECT_SERVER_MEMORY,
        **static_conf(),
        # Without YARN's Hadoop defaults (read by nothing off YARN): half the settings each file
        # read and write carries, about a third of their (de)serialisation.
        **driver_classpath(master),
        # Session defaults: every client session starts with the steps' SQL settings.
        **REQUIRED_SQL_CONF,
        **SERVER_ONLY_CONF,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.app.name": "cdc-connect-server",
    }
    if os.environ.get(WARM_UP_ENV, "").strip().lower() == "false":
        settings[WARM_UP_CONF] = "false"  # `conf` wins
    settings.update(conf or {})
    # A user's own plugins run beside the Connect plugin, which the server cannot serve without.
    plugins = [p.strip() for p in settings["spark.plugins"].split(",") if p.strip()]
    settings["spark.plugins"] = ",".join(dict.fromkeys([PLUGIN_CLASS, *plugins]))
    return settings


@dataclass
class ConnectServer:
    """A running server: its URL, process (own process group) and log file."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    master: str
    host: str = BIND_ADDRESS
    conf: dict[str, str] = field(default_factory=dict)

    @property
    def client_host(self) -> str:
        """Where a local client reaches it (loopback when bound to every address)."""
        return BIND_ADDRESS if self.host in ("0.0.0.0", "") else self.host

    @property
    def url(self) -> str:
        """The Connect URL clients use (`CDC_SPARK_REMOTE`)."""
        return f"sc://{self.client_host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = 180) -> None:
        """Wait until the port is open and a trivial query answers; raise if the server exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConnectServerError(
                    f"the Spark Connect server exited with {self.process.returncode} "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if port_open(self.client_host, self.port):
                try:
                    check_query(self.url)
                    return
                except Exception as error:  # still starting up: ask again
                    last = error
                    time.sleep(1)
                    continue
            time.sleep(0.5)
        detail = f": {last}" if "last" in locals() else ""
        raise ConnectServerError(
            f"the Spark Connect server on {self.url} did not answer within {timeout:.0f} s"
            f"{detail} (log {self.log_path})"
        )

    def stop(self, timeout: float = 30) -> None:
        """Stop the server by its process group (spark-submit and its JVM)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def server_command(
    port: int, master: str, conf: Mapping[str, str] | None = None, host: str = BIND_ADDRESS
) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line of a server and its environment (the local launcher's and
    the compose service's: one set of settings)."""
    home = spark_home()
    command = [str(home / "bin" / "spark-submit"), "--master", master]
    # The driver program runs in this Python (pyspark installed), not whatever python3 is first.
    settings = {
        "spark.pyspark.driver.python": sys.executable,
        **server_conf(port, conf, host, master),
    }
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command.append(str(DRIVER_PROGRAM))
    env = dict(os.environ, SPARK_HOME=str(home))
    env.update(utf8_locale(env))  # file names as UTF-8, whatever the caller's locale
    env.setdefault("SPARK_LOCAL_IP", BIND_ADDRESS)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return command, env


def start(
    port: int | None = None,
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    wait: bool = True,
    timeout: float = 180,
    host: str = BIND_ADDRESS,
) -> ConnectServer:
    """Start a Spark Connect server on 127.0.0.1:`port` (default: a free port) with `master`.

    `host` is the address to bind: loopback by default; 0.0.0.0 in a container that other
    containers reach. The server runs in its own process group; stop it with `.stop()` (or use it as a context
    manager). With `wait`, returns once it answers a query.
    """
    port = port or free_port()
    if port_open(BIND_ADDRESS, port):
        raise ConnectServerError(f"port {port} on {BIND_ADDRESS} is already in use")
    command, env = server_command(port, master, conf, host)
    settings = server_conf(port, conf, host, master)
    log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"cdc-connect-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    server = ConnectServer(port, process, log_path, master, host, settings)
    if wait:
        try:
            server.wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
    return server


def main(argv: list[str] | None = None) -> int:
    """Run a server in the foreground until Ctrl-C or SIGTERM (`--exec`: become it, as a
    container's main process does); `--probe URL`: exit 0 when a server's executors answer."""
    parser = argparse.ArgumentParser(prog="python -m cdc_airflow.local.connect_server")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--host", default=BIND_ADDRESS, help="address to bind (0.0.0.0: all)")
    parser.add_argument("--master", default=os.environ.get("CDC_SPARK_MASTER") or "local[2]")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark settings"
    )
    parser.add_argument(
        "--exec",
        action="store_true",
        help="replace this process with the server (logs on stdout: a container's command)",
    )
    parser.add_argument(
        "--probe", metavar="URL", help="run a query that needs executors on the server at URL"
    )
    args = parser.parse_args(argv)
    if args.probe:
        try:
            check_executors(args.probe)
        except Exception as error:
            print(f"unhealthy: {args.probe}: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        return 0
    extra = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--conf {item!r}: expected KEY=VALUE")
        extra[key] = value
    if args.exec:
        command, env = server_command(args.port, args.master, extra, args.host)
        sys.stdout.flush()
        os.execve(command[0], command, env)
    server = start(args.port, master=args.master, conf=extra, host=args.host)
    print(f"Spark Connect server on {server.url} (pid {server.pid}, log {server.log_path})")
    print("Ctrl-C stops it.", flush=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
