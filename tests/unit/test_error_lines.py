"""An error becomes one line, also when its message cannot be had."""

from __future__ import annotations

import pytest

from spark_jobs.runtime.failures import NOTHING_PAST, connect_server_lost, one_line


class Py4JJavaError(Exception):  # the name is what the classifier sees; no JVM here
    errmsg = "An error occurred while calling o358.collectToPython.\n"

    def __str__(self) -> str:
        raise ConnectionRefusedError(111, "Connection refused")  # py4j asks a dead JVM


def test_an_error_whose_text_needs_a_dead_jvm_still_gives_one_line() -> None:
    assert one_line(Py4JJavaError()) == (
        "Py4JJavaError: An error occurred while calling o358.collectToPython."
    )


def test_an_error_without_a_message_is_named_by_its_kind() -> None:
    assert one_line(KeyError()) == "KeyError"


class SparkConnectException(Exception):  # PySpark's, by name: what a client of a dead server gets
    pass


def _raised_while_cleaning_up() -> BaseException:
    """The step's action fails as the server restarts; its cleanup (unpersist) then fails too."""
    try:
        try:
            raise SparkConnectException(
                "[INVALID_HANDLE.SESSION_CHANGED] The handle abc is invalid. The existing Spark "
                "server driver instance has restarted. Please reconnect. SQLSTATE: HY000"
            )
        except SparkConnectException:
            raise SparkConnectException(
                "[NO_ACTIVE_SESSION] No active Spark session found."
            ) from None
    except SparkConnectException as error:
        return error


def test_a_server_restarted_mid_step_is_found_in_the_chain_and_named_with_its_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = _raised_while_cleaning_up()
    # `from None` hides the first error from tracebacks, not from __context__: it is found.
    assert "SESSION_CHANGED" in str(connect_server_lost(error))
    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://server:15002")
    line = one_line(error)
    assert line.startswith("Spark Connect server sc://server:15002 stopped answering (")
    assert "SESSION_CHANGED" in line and "rerun the step" in line


def test_any_other_error_is_not_a_lost_server(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect_server_lost(ValueError("a bad row")) is None
    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://server:15002")
    assert one_line(ValueError("a bad row")) == "ValueError: a bad row"


class _MultiThreadedRendezvous(Exception):  # gRPC's, by name
    pass


class PySparkRuntimeError(Exception):
    pass


def test_the_reason_is_the_line_naming_the_lost_session() -> None:
    try:
        try:
            raise _MultiThreadedRendezvous(
                "<_MultiThreadedRendezvous of RPC that terminated with:\n"
                "\tstatus = StatusCode.INTERNAL\n"
                '\tdetails = "[INVALID_HANDLE.SESSION_NOT_FOUND] The handle 09a1 is invalid."'
            )
        except _MultiThreadedRendezvous as grpc_error:
            raise PySparkRuntimeError(
                "[RESPONSE_ALREADY_RECEIVED] INVALID_HANDLE.SESSION_NOT_FOUND on the server but "
                "responses were already received from it."
            ) from grpc_error
    except PySparkRuntimeError as error:
        assert connect_server_lost(error) == (
            "PySparkRuntimeError: [RESPONSE_ALREADY_RECEIVED] INVALID_HANDLE.SESSION_NOT_FOUND "
            "on the server but responses were already received from it."
        )


class UnknownException(Exception):  # PySpark's name for a Java error it has no class for
    pass


@pytest.mark.parametrize(
    "message",
    [
        "(java.lang.IllegalStateException) Cannot call methods on a stopped SparkContext.\n"
        "This stopped SparkContext was created at:\n\n"
        "org.apache.spark.sql.connect.service.SparkConnectServer.main(SparkConnectServer.scala)",
        "(org.apache.spark.SparkException) Job 12 cancelled because SparkContext was shut down",
    ],
)
def test_a_job_ended_by_the_server_stopping_its_context_is_a_lost_server(message: str) -> None:
    # What a step in flight gets while the Connect server is being stopped (seen in the
    # deployment test): an ordinary error, not a gRPC one, so only its words tell.
    assert connect_server_lost(UnknownException(message)) == (
        f"UnknownException: {message.splitlines()[0]}"
    )


@pytest.mark.parametrize(
    ("environment", "advice"),
    [
        ({}, "driver memory is 1g, Spark's default: set CDC_SPARK_DRIVER_MEMORY higher, e.g. 4g"),
        (
            {"CDC_SPARK_REMOTE": "sc://127.0.0.1:15002"},
            "driver memory is 2g unless set where the server started (the Connect server's "
            "default): set CDC_SPARK_DRIVER_MEMORY higher (the Connect server's: restart it), "
            "e.g. 4g",
        ),
        (
            {"CDC_SPARK_REMOTE": "sc://127.0.0.1:15002", "CDC_SPARK_DRIVER_MEMORY": "6g"},
            "driver memory is 6g: set CDC_SPARK_DRIVER_MEMORY higher (the Connect server's: "
            "restart it), e.g. 12g",
        ),
    ],
)
def test_out_of_memory_names_the_heap_of_the_driver_that_ran_out(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], advice: str
) -> None:
    """A classic driver's default is Spark's 1g; the Connect server cdc starts has 2g."""
    for name in ("CDC_SPARK_REMOTE", "CDC_SPARK_DRIVER_MEMORY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    error = RuntimeError("java.lang.OutOfMemoryError: Java heap space")
    expected = f"Spark ran out of memory (java.lang.OutOfMemoryError): {advice}; {NOTHING_PAST}"
    assert one_line(error) == expected
