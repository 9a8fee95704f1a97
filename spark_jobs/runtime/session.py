"""The Spark session every step uses: UTC, microsecond Parquet timestamps, quiet logs.

Two kinds, the same results: a classic session on `CDC_SPARK_MASTER` (a JVM in this process),
or, with `CDC_SPARK_REMOTE=sc://HOST:PORT`, a Spark Connect client of a long-lived server.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_pipeline.errors import SparkUnavailableError, UsageError
from cdc_pipeline.jvm import utf8_locale
from cdc_pipeline.paths import spark_jars
from spark_jobs.runtime.object_store import s3a_conf

LOG4J_FILE = Path(__file__).parents[1] / "log4j2.properties"  # package data of spark_jobs
HADOOP_DEFAULTS_DIR = Path(__file__).parent / "hadoop_defaults"  # package data of spark_jobs

# Settings the Delta adapter and the transforms rely on; applied to any session, also one
# that spark-submit created or a Connect server holds, because they are runtime SQL settings.
REQUIRED_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Lenient expression evaluation: an unparsable date in a partition expression yields null
    # (and the row goes to quarantine) instead of failing the whole run.
    "spark.sql.ansi.enabled": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
    # Steps read explicit lists of data files: check them on the driver, not in a Spark
    # job per read (Spark's default above 32 paths).
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}


def spark_master() -> str:
    """`CDC_SPARK_MASTER`, else local[*]."""
    return os.environ.get("CDC_SPARK_MASTER") or "local[*]"


def spark_remote() -> str | None:
    """`CDC_SPARK_REMOTE` (a Spark Connect URL, sc://HOST:PORT), else None: classic mode."""
    return os.environ.get("CDC_SPARK_REMOTE") or None


def shuffle_partitions() -> str:
    """`CDC_SHUFFLE_PARTITIONS`, else 8 (the steps' data per run is small)."""
    return os.environ.get("CDC_SHUFFLE_PARTITIONS", "8")


def project_jars() -> list[Path]:
    """The jars every session loads, by name: those of `CDC_SPARK_JARS`, else of the checkout's
    jars/ that `make install` fetched (Delta Lake for Spark: docker/jars-pom.xml)."""
    return spark_jars()


def delta_conf() -> dict[str, str]:
    """Spark's own Delta reader and catalog, when the jars are there: users (and the tests) read
    every table with `spark.read.format("delta")`, at any version. The steps never use it:
    they read and commit through delta-rs (DESIGN.md)."""
    jars = project_jars()
    if not jars:
        return {}
    return {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta rebuilds a version's state (its log replayed) in 50 tasks by default, a cost
        # made for huge logs: on 2 cores a read of one version took 4.6 s with 50 tasks and
        # 1.1 s with 2 (tests/spark/test_delta_spark_reader.py; docs/operations.md).
        "spark.databricks.delta.snapshotPartitions": shuffle_partitions(),
    }


DRIVER_MEMORY_ENV = "CDC_SPARK_DRIVER_MEMORY"


def driver_memory() -> str | None:
    """`CDC_SPARK_DRIVER_MEMORY` (a JVM size: 2g, 4096m), else None: Spark's default, 1g."""
    text = os.environ.get(DRIVER_MEMORY_ENV, "").strip()
    if text and not re.fullmatch(r"\d+[kKmMgGtT]?", text):
        raise UsageError(
            f"{DRIVER_MEMORY_ENV}={text!r} must be a JVM memory size such as 2g or 4096m"
        )
    return text or None


def static_conf() -> dict[str, str]:
    """Settings fixed when the driver JVM starts: a classic session's, or the Connect server's."""
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J_FILE}"
    memory = driver_memory()
    return {
        # In local mode the driver's heap is also the executors': a large change file needs more.
        **({"spark.driver.memory": memory} if memory else {}),
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.log.structuredLogging.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": os.environ.get("CDC_SPARK_UI", "false"),
        # PySpark otherwise records the Python call site of every column function for error
        # messages: in classic mode four more JVM round trips per call (a quarter of those a
        # step makes to build its plan), under Connect a failed `import IPython` per call. The
        # steps' errors name their table and step themselves. Read once per process.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.sql.shuffle.partitions": shuffle_partitions(),
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.hadoop.parquet.enable.summary-metadata": "false",
        # Local files are read and written without Hadoop's `.name.crc` checksum sidecars: a
        # stale or foreign sidecar beside a landed file (as Hadoop writers leave them) failed
        # its read with a ChecksumException, every run. Parquet and Delta carry their own checks.
        "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
        "spark.hadoop.fs.file.impl.disable.cache": "true",
        **delta_conf(),
    }


def driver_classpath(master: str | None) -> dict[str, str]:
    """The driver's default extra classpath for `master`: ahead of Hadoop's jars, a folder whose
    empty yarn-default.xml keeps YARN's defaults out of the driver's Hadoop configuration, for
    every master but YARN (whose client reads them). That configuration travels with every file
    read and write, a gzip stream per setting, and YARN's are 527 of its 1,122: without them
    each (de)serialisation costs about a third (docs/performance-log.md). Spark's launcher puts
    `spark.driver.defaultExtraClassPath` after a user's own `spark.driver.extraClassPath`, which
    stays as it is, and both before Spark's jars. A JVM setting: it applies where the driver
    starts (a classic session, a Connect server), not to a running session."""
    if master is None or master.strip().lower().startswith("yarn"):
        return {}
    return {"spark.driver.defaultExtraClassPath": str(HADOOP_DEFAULTS_DIR)}


def build_spark_session(
    app_name: str = "cdc", master: str | None = None, remote: str | None = None
) -> SparkSession:
    """The step session: a Connect client of `remote` (default `CDC_SPARK_REMOTE`) or classic.

    An explicit `master` asks for a classic session even when `CDC_SPARK_REMOTE` is set.
    """
    url = remote or (None if master else spark_remote())
    if url:
        return build_connect_session(url, app_name)
    return build_classic_session(app_name, master)


# The light install (pyspark-client: the Spark Connect client, no JVM) has no classic Spark.
CLASSIC_SPARK_MISSING = (
    "classic Spark is not installed (this install has only the Spark Connect client, "
    "pyspark-client): install `cdc-lakehouse[spark]`, or set CDC_SPARK_REMOTE=sc://HOST:PORT "
    "to run the steps on a Spark Connect server"
)


def classic_spark_installed() -> bool:
    """Whether the full pyspark (its JVM and jars) is installed, not only the Connect client."""
    from pyspark.util import is_remote_only

    return not is_remote_only()


def build_classic_session(app_name: str = "cdc", master: str | None = None) -> SparkSession:
    """Get or create the in-process session; under spark-submit its master and resources win."""
    if not classic_spark_installed():
        raise UsageError(CLASSIC_SPARK_MISSING)
    # PySpark's per-process Connect switch, inherited from a process that ran a Connect client
    # (an Airflow worker that ran a Connect task before this spark-submit), would make the
    # builder look for a remote server.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    os.environ.update(utf8_locale(os.environ))  # the driver JVM starts with this environment
    builder = SparkSession.builder.appName(app_name)
    jvm_conf = static_conf()
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set when spark-submit runs this file
        master = master or spark_master()
        builder = builder.master(master)
        jvm_conf.update(driver_classpath(master))
    for key, value in {**jvm_conf, **REQUIRED_SQL_CONF}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in {**REQUIRED_SQL_CONF, **s3a_conf()}.items():
        spark.conf.set(key, value)
    # The JVM's log level is log4j2.properties' (warn): no sparkContext call needed.
    return spark


def build_connect_session(url: str, app_name: str = "cdc") -> SparkSession:
    """A new Spark Connect session of the server at `url`, with the steps' SQL settings.

    The server holds the JVM settings (logging, UI, committer): only runtime SQL settings are
    set per session. Switches this process's PySpark functions to Connect, as
    `SparkSession.builder.remote` does (PySpark decides per process which kind a column is).
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    _probe_connect_server(url)
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session: Any = ConnectSession.builder.remote(url).create()
    # PySpark's own policy retries an unavailable server for over 10 minutes: a step whose server
    # died would hang that long. Bounded to about CDC_SPARK_CONNECT_TIMEOUT seconds of back-off.
    session.client.set_retry_policies([DefaultPolicy(**connect_retry_policy())])
    set_session_conf(
        session,
        {
            **REQUIRED_SQL_CONF,
            "spark.sql.shuffle.partitions": shuffle_partitions(),
            **s3a_conf(),  # where and as whom: this client's environment, not the server's
        },
    )
    # The app name is the server's; the session says whose it is with tags (job lists, and
    # interrupts: an Airflow task passes its own in CDC_SPARK_TAGS).
    for tag in [app_name, *os.environ.get("CDC_SPARK_TAGS", "").split(",")]:
        if tag:
            session.addTag(tag)
    return session  # type: ignore[no-any-return]


def set_session_conf(session: Any, settings: dict[str, str]) -> None:
    """Set `settings` on a Connect session in one request, as `spark.conf.set` does one at a
    time (a request each, of every task: a step's session has seven or more). A setting the
    server refuses fails the call, naming it, as `set` would; its warnings are warnings."""
    import warnings

    from pyspark.sql.connect.proto import ConfigRequest, KeyValue

    pairs = [KeyValue(key=key, value=value) for key, value in settings.items()]
    operation = ConfigRequest.Operation(set=ConfigRequest.Set(pairs=pairs))
    for warning in session.client.config(operation).warnings:
        warnings.warn(warning, stacklevel=2)


def unset_session_conf(session: Any, keys: Iterable[str]) -> None:
    """Unset `keys` on a Connect session in one request: each is the server's own again."""
    from pyspark.sql.connect.proto import ConfigRequest

    operation = ConfigRequest.Operation(unset=ConfigRequest.Unset(keys=list(keys)))
    session.client.config(operation)


CONNECT_TIMEOUT_ENV = "CDC_SPARK_CONNECT_TIMEOUT"


def connect_timeout() -> float:
    """Seconds a step waits for an unreachable Spark Connect server (`CDC_SPARK_CONNECT_TIMEOUT`,
    default 60) before it fails."""
    text = os.environ.get(CONNECT_TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else 60.0
    except ValueError:
        value = 0.0
    if value <= 0:
        raise UsageError(f"{CONNECT_TIMEOUT_ENV}={text!r} must be a number of seconds above 0")
    return value


def connect_retry_policy(timeout: float | None = None) -> dict[str, Any]:
    """DefaultPolicy arguments whose back-offs add up to about `timeout` seconds: 50 ms,
    times 4 each retry, at most a quarter of the timeout each."""
    budget_ms = (timeout or connect_timeout()) * 1000
    cap = max(100, int(budget_ms / 4))
    waited, retries, backoff = 0.0, 0, 50.0
    while waited + min(backoff, cap) <= budget_ms and retries < 50:
        waited += min(backoff, cap)
        backoff *= 4
        retries += 1
    return {"max_retries": max(retries, 1), "max_backoff": cap, "max_server_retry_delay": cap}


def _probe_connect_server(url: str) -> None:
    """Fail at once, naming the URL, when nothing listens at the server's address (the client
    itself would retry for minutes and then name no URL)."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        with socket.create_connection((host, port), timeout=min(10.0, connect_timeout())):
            return
    except OSError as error:
        reason = str(error.strerror or error)
        raise SparkUnavailableError(
            f"Spark Connect server {url} is not reachable ({reason}): start it "
            "(`make airflow` starts one) or fix CDC_SPARK_REMOTE",
            reason,
        ) from None


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (no sparkContext, no JVM in this process)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark, ConnectSession)


# A small run's plan (`plan_run`): no adaptive execution, no whole-stage code generation.
SMALL_RUN_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"}


def plan_run(spark: Any, *, small: bool) -> None:
    """Plan the rest of a Connect session's step for its size: a `small` run (one task's rows,
    no shuffle) without adaptive query execution and without whole-stage code generation, any
    other with the server's settings (unset: a session that planned a small run before, such as
    the one `cdc demo` keeps for every step, would otherwise write a large run's shuffle
    partitions as they come, with no adaptive execution to merge them).

    A small run leaves adaptive execution nothing to adapt, while it still wraps each query in
    stages it re-plans and runs a cached relation as a job of its own. On a warm server (300
    changes): stage 0.53 -> 0.48 s and overwrite-final 0.63 -> 0.55 s of a CSV table, 0.38 ->
    0.37 s and 0.66 -> 0.62 s of a partitioned Parquet one. Generating (and looking up) a
    query's whole-stage Java code costs more than it saves on a few hundred rows: the JSON
    stage's read of 2 lines took 161 ms of server CPU without it against 200 (one warm server,
    reads in turn), and the steps of the bench's three tables 0-21 ms less wall time a run
    (runs in turn, 2026-12-06); each expression is still compiled on its own. A classic session
    outlives the step (the next one may be large): it keeps its settings."""
    if not is_connect(spark):
        return
    if small:
        set_session_conf(spark, SMALL_RUN_CONF)
    else:
        unset_session_conf(spark, SMALL_RUN_CONF)


def new_observation(spark: Any, name: str) -> Any:
    """An `Observation` of `spark`'s kind (Connect's and classic's are different classes)."""
    if is_connect(spark):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        return ConnectObservation(name)
    from pyspark.sql.observation import Observation

    return Observation(name)


def observe(frame: Any, observation: Any, *exprs: Any) -> Any:
    """`frame.observe(observation, *exprs)`, without the request PySpark's Connect client sends
    first to ask whether `frame` streams: an analysis of the frame's whole plan on the server
    (overwrite-final's ranking: 43-56 ms of a 300-change run), which the action analyses again.
    The steps observe batch reads only. The same plan node and bookkeeping as `_on`'s."""
    if not is_connect(frame.sparkSession):
        return frame.observe(observation, *exprs)
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    from pyspark.sql.connect.plan import CollectMetrics

    if observation._result is not None:  # as PySpark: an observation serves one frame
        return frame.observe(observation, *exprs)  # raises REUSE_OBSERVATION
    observation._result = {}  # filled from the action's response
    observed = ConnectDataFrame(
        CollectMetrics(frame._plan, observation, list(exprs)), frame._session
    )
    observed._cached_schema = frame._cached_schema
    return observed


def observed_metrics(observation: Any) -> dict[str, Any] | None:
    """The metrics an action gathered for `observation` (`DataFrame.observe`); None when no
    action has gathered them, where PySpark's own `get` would wait forever (classic) or raise
    (Connect)."""
    java = getattr(observation, "_jo", None)
    if java is not None:  # classic: completed by the action, on its thread, before it returns
        if not java.future().isCompleted() or java.getRow().length() == 0:
            return None  # an action whose plan left the observed rows out completes it empty
        return dict(observation.get)
    if not getattr(observation, "_result", None):  # Connect: set from the response (or empty)
        return None
    return dict(observation.get)
