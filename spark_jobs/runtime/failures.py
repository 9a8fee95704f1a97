"""A failure as one line: the error's message, what a lost Connect server, an out-of-memory JVM
or a read-only folder mean, and what to do about them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from cdc_pipeline.errors import (
    CdcError,
)
from cdc_pipeline.jvm import CONNECT_SERVER_MEMORY


def _message(error: BaseException) -> str:
    """An error's message, also when it cannot be had: py4j's Java errors ask the JVM for their
    text, and a JVM that has just died (out of memory) cannot answer."""
    try:
        return str(error)
    except Exception:
        return str(getattr(error, "errmsg", "") or "")


def one_line(error: BaseException) -> str:
    """An error as one line: its message's first line, prefixed by its kind for non-CDC errors."""
    if isinstance(error, CdcError):
        message = _message(error).strip()
        return message.splitlines()[0] if message else type(error).__name__
    resource = _resource_problem(error)
    if resource is not None:
        return resource
    remote = os.environ.get("CDC_SPARK_REMOTE")
    lost = connect_server_lost(error) if remote else None
    if lost is not None:
        # The server went away mid-step (its gRPC error names no server): say which one.
        return (
            f"Spark Connect server {remote} stopped answering ({lost}); "
            "nothing was committed past the last commit the summary reports: rerun the step"
        )
    return error_line(error)


# What a Spark Connect client reports when its server restarted or dropped the step's session:
# a new server instance answers the old session with INVALID_HANDLE.SESSION_CHANGED or
# SESSION_NOT_FOUND (PySpark may wrap it in RESPONSE_ALREADY_RECEIVED), PySpark then refuses
# every call on that session with NO_ACTIVE_SESSION; a server that is gone, gRPC's UNAVAILABLE.
# (Seen in tests/deploy/test_topology.py, the Connect server restarted during a cycle.)
_SERVER_LOST_TYPES = ("SparkConnectGrpcException", "RetriesExceeded")


# A server being stopped first stops its SparkContext: a job in flight then fails with one of the
# last two (an IllegalStateException or SparkException sent back as an ordinary error).
_SERVER_LOST_MARKERS = (
    "INVALID_HANDLE.SESSION_",
    "NO_ACTIVE_SESSION",
    "StatusCode.UNAVAILABLE",
    "Cannot call methods on a stopped SparkContext",
    "because SparkContext was shut down",
)


def connect_server_lost(error: BaseException) -> str | None:
    """Why the Spark Connect server stopped answering or restarted during the step, when
    `error`'s chain (its causes and the errors it was raised while handling) says so: transient,
    a retry of the step resumes. The reason is the chain's most telling line (`Kind: line`).
    None when the failure is anything else."""
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current).__name__
        text = _message(current)
        for line in text.splitlines():
            if any(marker in line for marker in _SERVER_LOST_MARKERS):
                lines.append(f"{kind}: {line.strip()}")
        if kind in _SERVER_LOST_TYPES and not lines:
            lines.append(error_line(current))
        current = current.__cause__ or current.__context__
    if not lines:
        return None
    return next((line for line in lines if _SERVER_LOST_MARKERS[0] in line), lines[0])


def error_line(error: BaseException) -> str:
    """`Kind: first line of the message`."""
    message = _message(error).strip()
    return f"{type(error).__name__}: {message.splitlines()[0]}" if message else type(error).__name__


NOTHING_PAST = "nothing past the last commit the summary reports was written"


SPARK_DRIVER_MEMORY = "1g"  # Spark's own default heap of a driver


def _driver_memory_advice() -> str:
    setting = os.environ.get("CDC_SPARK_DRIVER_MEMORY")
    remote = bool(os.environ.get("CDC_SPARK_REMOTE"))
    if setting:
        size, memory = setting, setting
    elif remote:  # the server's own setting, unknown here: the default of a server cdc starts
        size = CONNECT_SERVER_MEMORY
        memory = f"{size} unless set where the server started (the Connect server's default)"
    else:
        size = SPARK_DRIVER_MEMORY
        memory = f"{size}, Spark's default"
    where = " (the Connect server's: restart it)" if remote else ""
    return (
        f"driver memory is {memory}: set CDC_SPARK_DRIVER_MEMORY higher{where}, "
        f"e.g. {_larger_memory(size)}"
    )


_JVM_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _larger_memory(size: str) -> str:
    """A JVM size above `size`: 4g, or twice `size` from 4g up, so the advice never names what
    already failed."""
    found = re.fullmatch(r"(\d+)([kmgt])b?", size.strip().lower())
    if found is None:
        return "4g"
    number, unit = int(found.group(1)), found.group(2)
    if number * _JVM_UNITS[unit] < 4 * _JVM_UNITS["g"]:
        return "4g"
    return f"{number * 2}{unit}"


def _resource_problem(error: BaseException) -> str | None:
    """The one line for an error whose cause is the machine, not the data: the driver out of
    memory, the disk full, the storage read-only (Spark names them only deep in a Java trace)."""
    texts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(f"{type(current).__name__}: {_message(current)}")
        current = current.__cause__ or current.__context__
    text = "\n".join(texts)
    out_of_memory = (
        f"Spark ran out of memory (java.lang.OutOfMemoryError): {_driver_memory_advice()}; "
        + NOTHING_PAST
    )
    if "OutOfMemoryError" in text or "GC overhead limit exceeded" in text:
        return out_of_memory
    if "No space left on device" in text:
        return (
            "disk full (No space left on device): free space where CDC_WAREHOUSE lives and in "
            f"Spark's scratch directory (spark.local.dir, default /tmp), then rerun; {NOTHING_PAST}"
        )
    if (
        "Read-only file system" in text
        or "ReadOnlyFileSystemException" in text
        or _read_only_folder(text)
    ):
        return (
            "storage is read-only (Read-only file system): CDC_WAREHOUSE must be writable; remount "
            f"it read-write or point CDC_WAREHOUSE elsewhere, then rerun; {NOTHING_PAST}"
        )
    exit_code = _driver_jvm_exit() if "Py4J" in text or "Connection refused" in text else None
    if exit_code == SPARK_EXIT_OOM:
        return out_of_memory
    if exit_code is not None or (
        not os.environ.get("CDC_SPARK_REMOTE")
        and (
            type(error).__name__ in ("Py4JNetworkError", "ConnectionRefusedError")
            or "Answer from Java side is empty" in text
        )
    ):
        return (
            "Spark's driver JVM exited mid-step (most often out of memory: look for "
            f"java.lang.OutOfMemoryError above): {_driver_memory_advice()}; {NOTHING_PAST}"
        )
    return None


SPARK_EXIT_OOM = 52  # SparkExitCode.OOM: the JVM's exit after an OutOfMemoryError in a task


def _driver_jvm_exit() -> int | None:
    """The exit code of the classic session's driver JVM if it died under this step, else None.

    An OutOfMemoryError in a task makes Spark's uncaught-exception handler exit the JVM with
    code 52; the Python side then sees whatever the dying JVM answered last (a stopped
    SparkContext's NullPointerException, a refused connection), not the OutOfMemoryError.
    Waits a few seconds for the exit: the JVM runs its shutdown hooks first.
    """
    if os.environ.get("CDC_SPARK_REMOTE") or "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return None
    try:
        return int(process.wait(timeout=JVM_EXIT_WAIT_SECONDS))
    except subprocess.TimeoutExpired:
        return None  # the JVM lives: an ordinary Java error


JVM_EXIT_WAIT_SECONDS = 10


def _read_only_folder(text: str) -> bool:
    """Whether Hadoop's "Mkdirs failed to create <path>" (its local file system says no more)
    is about a folder on a read-only mount."""
    failed = re.search(r"Mkdirs failed to create (?:file:)?(/\S+)", text)
    if failed is None:
        return False
    folder = Path(failed.group(1))
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
