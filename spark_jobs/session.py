"""The Spark session every step uses: UTC, microsecond Parquet timestamps, quiet logs.

Two kinds, the same results: a classic session on `CDC_SPARK_MASTER` (a JVM in this process),
or, with `CDC_SPARK_REMOTE=sc://HOST:PORT`, a Spark Connect client of a long-lived server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_pipeline.jvm import utf8_locale

LOG4J_FILE = Path(__file__).with_name("log4j2.properties")
JARS_DIR = Path(__file__).resolve().parent.parent / "jars"  # filled by `make install`

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
    """The jars `make install` fetched (Delta Lake for Spark: docker/jars-pom.xml), by name."""
    return sorted(JARS_DIR.glob("*.jar"))


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
    }


def static_conf() -> dict[str, str]:
    """Settings fixed when the driver JVM starts: a classic session's, or the Connect server's."""
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J_FILE}"
    return {
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.log.structuredLogging.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": os.environ.get("CDC_SPARK_UI", "false"),
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


def build_classic_session(app_name: str = "cdc", master: str | None = None) -> SparkSession:
    """Get or create the in-process session; under spark-submit its master and resources win."""
    # PySpark's per-process Connect switch, inherited from a process that ran a Connect client
    # (an Airflow worker that ran a Connect task before this spark-submit), would make the
    # builder look for a remote server.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    os.environ.update(utf8_locale(os.environ))  # the driver JVM starts with this environment
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set when spark-submit runs this file
        builder = builder.master(master or spark_master())
    for key, value in {**static_conf(), **REQUIRED_SQL_CONF}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in REQUIRED_SQL_CONF.items():
        spark.conf.set(key, value)
    # The JVM's log level is log4j2.properties' (warn): no sparkContext call needed.
    return spark


def build_connect_session(url: str, app_name: str = "cdc") -> SparkSession:
    """A new Spark Connect session of the server at `url`, with the steps' SQL settings.

    The server holds the JVM settings (logging, UI, committer): only runtime SQL settings are
    set per session. Switches this process's PySpark functions to Connect, as
    `SparkSession.builder.remote` does (PySpark decides per process which kind a column is).
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session: Any = ConnectSession.builder.remote(url).create()
    for key, value in {
        **REQUIRED_SQL_CONF,
        "spark.sql.shuffle.partitions": shuffle_partitions(),
    }.items():
        session.conf.set(key, value)
    # The app name is the server's; the session says whose it is with tags (job lists, and
    # interrupts: an Airflow task passes its own in CDC_SPARK_TAGS).
    for tag in [app_name, *os.environ.get("CDC_SPARK_TAGS", "").split(",")]:
        if tag:
            session.addTag(tag)
    return session  # type: ignore[no-any-return]


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (no sparkContext, no JVM in this process)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark, ConnectSession)
