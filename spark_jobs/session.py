"""The Spark session every step uses: UTC, microsecond Parquet timestamps, quiet logs."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import SparkSession

LOG4J_FILE = Path(__file__).with_name("log4j2.properties")

# Settings the Delta adapter and the transforms rely on; applied to any session, also one
# that spark-submit created, because they are runtime SQL settings.
REQUIRED_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Lenient expression evaluation: an unparsable date in a partition expression yields null
    # (and the row goes to quarantine) instead of failing the whole run.
    "spark.sql.ansi.enabled": "false",
    "spark.sql.sources.partitionOverwriteMode": "static",
}


def spark_master() -> str:
    """`CDC_SPARK_MASTER`, else local[*]."""
    return os.environ.get("CDC_SPARK_MASTER") or "local[*]"


def build_spark_session(app_name: str = "cdc", master: str | None = None) -> SparkSession:
    """Get or create the session; under spark-submit its master and resources win."""
    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set when spark-submit runs this file
        builder = builder.master(master or spark_master())
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J_FILE}"
    builder = (
        builder.config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.log.structuredLogging.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", os.environ.get("CDC_SPARK_UI", "false"))
        .config("spark.sql.shuffle.partitions", os.environ.get("CDC_SHUFFLE_PARTITIONS", "8"))
        .config("spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .config("spark.hadoop.parquet.enable.summary-metadata", "false")
        # Steps read explicit lists of data files: check them on the driver, not in a Spark
        # job per read (Spark's default above 32 paths).
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
    )
    for key, value in REQUIRED_SQL_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for key, value in REQUIRED_SQL_CONF.items():
        spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("WARN")
    return spark
