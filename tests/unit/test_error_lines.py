"""An error becomes one line, also when its message cannot be had."""

from __future__ import annotations

from spark_jobs.common import one_line


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
