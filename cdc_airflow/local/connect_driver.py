"""The Spark Connect server's driver program: `connect_server` runs this file with spark-submit.

Spark's own server class (`SparkConnectServer`) isolates every client session's artifacts,
including the classloader each query's generated code is compiled under, and Spark caches
compiled code per classloader. Every task of every table opens a session of its own, so each
step compiled all of its generated code again. Here the server is Spark's Connect plugin on a
session started with artifact isolation off (`connect_server.SERVER_ONLY_CONF`): sessions share
one classloader and the compiled code, as the steps add no artifacts of their own.

The program only keeps the driver alive: the plugin serves the clients, the JVM exits when this
process does, and this process exits when the JVM does (Linux's parent-death signal).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys


def _exit_with_parent() -> None:
    """Linux sends SIGTERM to this process when the JVM that started it dies."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def main() -> int:
    _exit_with_parent()
    # The server is the classic session: a client's settings inherited from whoever started
    # it (a Connect-mode test, a shell with SPARK_REMOTE) would make PySpark look for a server.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        os.environ.pop(name, None)
    from pyspark.sql import SparkSession

    # Every setting comes from spark-submit's --conf (connect_server.server_command).
    SparkSession.builder.getOrCreate()
    print("cdc connect driver: the Spark Connect plugin is serving", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
