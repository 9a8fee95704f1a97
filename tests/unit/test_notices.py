"""A step's warning is a log record in an Airflow task and a `warning:` line for the CLI."""

from __future__ import annotations

import logging

import pytest

from spark_jobs.runtime.notices import LOGGER, show_warnings_on_stderr, warn


def test_a_warning_is_a_record_until_the_cli_shows_it_on_stderr(
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As in an Airflow task: nothing installed, the record goes to the task's log handlers.
    monkeypatch.setattr(LOGGER, "handlers", [])
    monkeypatch.setattr(LOGGER, "propagate", True)
    with caplog.at_level(logging.WARNING):
        warn("table t: schema evolved: +V")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("cdc.steps", "WARNING", "table t: schema evolved: +V")
    ]
    assert capsys.readouterr().err == ""
    # As in the `cdc` command and a spark-submit entry (twice: installed once).
    show_warnings_on_stderr()
    show_warnings_on_stderr()
    caplog.clear()
    warn("table t: 1 file refused")
    assert capsys.readouterr().err == "warning: table t: 1 file refused\n"
    assert caplog.records == []
