"""What a step did: its report, the one summary line, and the summary file an Airflow task
reads (CDC_SUMMARY_PATH), also for a failure."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from cdc_pipeline.counts import Counts, NoopCounts
from cdc_pipeline.intervals import Interval

C = TypeVar("C", bound=Counts)


@dataclass
class StepReport(Generic[C]):
    """What a step did, printed as one summary line: `step table interval: key=value ...`.
    `result` is the step's typed counts (`cdc_pipeline.counts`); `counts` the same by name."""

    step: str
    table: str
    interval: str
    result: C

    @property
    def counts(self) -> dict[str, Any]:
        """The counts by name, in the order the line shows them (the JSON's `counts`)."""
        return self.result.as_dict()

    def line(self) -> str:
        """The one-line summary."""
        where = f" {self.interval}" if self.interval else ""
        values = " ".join(f"{k}={v}" for k, v in self.counts.items())
        return f"{self.step} {self.table}{where}: {values}".rstrip()


def noop_report(prog: str, table: str, interval: Interval) -> StepReport:
    """The report of an interval with nothing to do: no landing file, no staged batch."""
    return StepReport(prog, table, str(interval), NoopCounts())


def summary_payload(report: StepReport) -> dict[str, Any]:
    """The report as plain JSON data (an Airflow task's XCom): step, table, interval, counts, line."""
    payload = {
        "step": report.step,
        "table": report.table,
        "interval": report.interval,
        "counts": report.counts,
        "line": report.line(),
    }
    return dict(json.loads(json.dumps(payload, default=str)))


def write_failure(line: str, *, permanent: bool) -> None:
    """Where CDC_SUMMARY_PATH says, the failure's one line and whether a retry would fail the
    same way (the Airflow task fails with that line, once if permanent)."""
    target = os.environ.get("CDC_SUMMARY_PATH")
    if target:
        Path(target).write_text(json.dumps({"error": line, "permanent": permanent}))


def write_summary(report: StepReport) -> bool:
    """Write the counts as JSON where CDC_SUMMARY_PATH says (the Airflow task reads them);
    whether it did."""
    target = os.environ.get("CDC_SUMMARY_PATH")
    if target:
        Path(target).write_text(json.dumps(summary_payload(report)))
    return bool(target)
