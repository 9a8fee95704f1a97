"""The Spark Connect server's driver program: `connect_server` runs this file with spark-submit.

Spark's own server class (`SparkConnectServer`) isolates every client session's artifacts,
including the classloader each query's generated code is compiled under, and Spark caches
compiled code per classloader. Every task of every table opens a session of its own, so each
step compiled all of its generated code again. Here the server is Spark's Connect plugin on a
session started with artifact isolation off (`connect_server.SERVER_ONLY_CONF`): sessions share
one classloader and the compiled code, as the steps add no artifacts of their own.

The program keeps the driver alive: the plugin serves the clients, the JVM exits when this
process does, and this process exits when the JVM does (Linux's parent-death signal). On a local
master it also starts the server's warm-up in the background (`warm_up`; off with
`spark.cdc.warmUp=false`: `warms_up`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _exit_with_parent() -> None:
    """Linux sends SIGTERM to this process when the JVM that started it dies."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


# The server's Spark setting that switches its warm-up off (`false`).
WARM_UP_CONF = "spark.cdc.warmUp"


def warms_up(master: str, settings: Mapping[str, str]) -> bool:
    """Whether a server of `master` with `settings` warms itself up: on a local master (a
    cluster's executors cannot reach this machine's temporary folder), unless switched off."""
    switched_off = settings.get(WARM_UP_CONF, "true").strip().lower() == "false"
    return master.startswith("local") and not switched_off


def start_warm_up(spark: Any) -> subprocess.Popen[bytes] | None:
    """When the server `warms_up`: `warm_up` against it, in the background, its output in the
    server's log; it dies with this process."""
    conf = dict(spark.sparkContext.getConf().getAll())
    if not warms_up(conf.get("spark.master", ""), conf):
        return None
    host = conf.get("spark.connect.grpc.binding.address", "127.0.0.1")
    port = conf.get("spark.connect.grpc.binding.port", "15002")
    url = f"sc://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
    # Nothing of a step's own: no summary file, no test hooks.
    own = ("CDC_SUMMARY_PATH", "CDC_FAULT", "CDC_BARRIER")
    env = {k: v for k, v in os.environ.items() if k not in own}
    # The package importable even when not installed (a source tree).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "cdc_airflow.local.warm_up", url]
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, preexec_fn=_exit_with_parent
    )
    threading.Thread(target=process.wait, name="warm-up reaper", daemon=True).start()
    return process


def main() -> int:
    _exit_with_parent()
    # The server is the classic session: a client's settings inherited from whoever started
    # it (a Connect-mode test, a shell with SPARK_REMOTE) would make PySpark look for a server.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        os.environ.pop(name, None)
    from pyspark.sql import SparkSession

    # Every setting comes from spark-submit's --conf (connect_server.server_command).
    session = SparkSession.builder.getOrCreate()
    print("cdc connect driver: the Spark Connect plugin is serving", flush=True)
    start_warm_up(session)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
