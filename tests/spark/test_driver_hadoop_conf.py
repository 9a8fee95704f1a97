"""A local driver's Hadoop configuration leaves out YARN's defaults and keeps every other
(spark_jobs/runtime/session.py, driver_classpath): the configuration each file read and write
carries is about half as large, and what Spark's file writes read from it is as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.spark


def property_sources(spark: Any) -> dict[str, str]:
    """Each property of the driver's Hadoop configuration with the resource that set it."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    jvm.org.apache.hadoop.mapred.JobConf(conf)  # as Spark's writes do: MapReduce's defaults join
    writer = jvm.java.io.StringWriter()
    jvm.org.apache.hadoop.conf.Configuration.dumpConfiguration(conf, writer)
    dumped = json.loads(writer.toString())["properties"]
    return {p["key"]: p["resource"] for p in dumped}


def test_a_local_driver_has_no_yarn_defaults_and_keeps_core_and_mapreduce_ones(
    spark_classic: Any,
) -> None:
    sources = property_sources(spark_classic)
    resources = set(sources.values())
    assert "yarn-default.xml" not in resources, sorted(resources)
    assert {"core-default.xml", "mapred-default.xml"} <= resources
    conf = spark_classic._jsc.hadoopConfiguration()
    assert conf.get("yarn.resourcemanager.address") is None  # yarn-default.xml's
    # What the file writes read is as before: the committer's algorithm, the default file system,
    # the project's own settings (no _SUCCESS file, no .crc sidecars).
    assert conf.get("mapreduce.fileoutputcommitter.algorithm.version") == "1"
    assert conf.get("fs.defaultFS") == "file:///"
    assert conf.get("mapreduce.fileoutputcommitter.marksuccessfuljobs") == "false"
    assert conf.get("fs.file.impl") == "org.apache.hadoop.fs.RawLocalFileSystem"
    # Under half of the 1,122 settings with YARN's (Spark 4.2's Hadoop 3.5 client).
    assert len(sources) < 700, len(sources)


def test_a_write_and_read_back_are_exact_with_the_smaller_configuration(
    spark_classic: Any, tmp_path: Any
) -> None:
    rows = [(i, f"v{i}") for i in range(300)]
    frame = spark_classic.createDataFrame(rows, "ID bigint, VALUE string")
    frame.write.parquet(str(tmp_path / "t"))
    back = spark_classic.read.parquet(str(tmp_path / "t"))
    assert sorted((r.ID, r.VALUE) for r in back.collect()) == rows
