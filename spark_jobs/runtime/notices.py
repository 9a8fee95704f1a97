"""The steps' warnings: log records of the `cdc.steps` logger.

In an Airflow task they are the task's own log records (level WARNING, this logger's name). The
`cdc` command and the spark-submit entries show them as `warning: <message>` lines on stderr
(`show_warnings_on_stderr`), the one summary line staying alone on stdout.
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("cdc.steps")


def warn(message: str) -> None:
    """One warning of a step (what it could not do, or did differently than asked)."""
    LOGGER.warning(message)


class StderrLines(logging.Handler):
    """`warning: <message>` on whatever sys.stderr is when the record comes (a test's capture,
    the CLI's tee for --json)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"warning: {record.getMessage()}", file=sys.stderr, flush=True)


def show_warnings_on_stderr() -> None:
    """Show the steps' warnings as stderr lines instead of passing them on (idempotent)."""
    if not any(isinstance(handler, StderrLines) for handler in LOGGER.handlers):
        LOGGER.addHandler(StderrLines())
    LOGGER.propagate = False
