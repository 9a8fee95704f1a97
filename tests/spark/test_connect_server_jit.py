"""The Connect server's JVM starts with C2's thresholds raised and G1's regions 16 MB
(connect_server.SERVER_ONLY_CONF, `spark.driver.defaultJavaOptions`), ahead of the steps' own
driver options, so that a user's `spark.driver.extraJavaOptions` comes after them and wins."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.local import connect_server

pytestmark = pytest.mark.spark

THRESHOLDS = {
    "-XX:Tier4InvocationThreshold=40000",
    "-XX:Tier4MinInvocationThreshold=4800",
    "-XX:Tier4CompileThreshold=120000",
    "-XX:Tier4BackEdgeThreshold=320000",
}
OPTIONS = THRESHOLDS | {"-XX:G1HeapRegionSize=16m"}


def java_arguments(server: Any) -> list[str]:
    """The command line of the server's driver JVM (spark-submit execs it: the server's pid)."""
    return Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")


def test_the_running_server_has_the_raised_thresholds_before_its_other_options(
    connect_server: Any,
) -> None:
    arguments = java_arguments(connect_server)
    assert set(arguments) >= OPTIONS, arguments
    log4j = next(i for i, a in enumerate(arguments) if a.startswith("-Dlog4j2.configurationFile"))
    assert max(arguments.index(t) for t in OPTIONS) < log4j  # extraJavaOptions come after


def test_the_running_servers_heap_has_16_mb_regions(connect_server: Any) -> None:
    # What the JVM took, not only what it was given: G1's region size as the JVM reports it.
    flags = subprocess.run(
        ["jcmd", str(connect_server.pid), "VM.flags"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "-XX:+UseG1GC" in flags.split(), flags
    assert "-XX:G1HeapRegionSize=16777216" in flags.split(), flags


def test_a_users_own_driver_options_stay_and_follow_the_thresholds() -> None:
    settings = connect_server.server_conf(15002, {"spark.driver.extraJavaOptions": "-Xss4m"})
    assert settings["spark.driver.extraJavaOptions"] == "-Xss4m"
    assert set(settings["spark.driver.defaultJavaOptions"].split()) == OPTIONS
    command, _ = connect_server.server_command(15002, "local[2]")
    assert any(c.startswith("spark.driver.defaultJavaOptions=-XX:Tier4") for c in command)
