"""The step registry: every Spark step once, read by the CLI, the DAG planner and the entry points.

A step is a module of `spark_jobs` (`spark_jobs/<module>.py`, which spark-submit runs) with a
body function `<module>_step(context, args)`; `cdc <name>` runs it from the command line, and
the DAG of each table runs the ones with `in_dag` as tasks named after their module, in the
order listed here. The kinds of arguments a step takes are in `spark_jobs.runtime.args`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# interval: TABLE --start --end; table: TABLE; vacuum: TABLE [--retention-hours] [--force];
# as_of: TABLE --at [--output] [--limit]; tables: [TABLE ...] (check: its own entry).
ArgumentKind = Literal["interval", "table", "vacuum", "as_of", "tables"]


@dataclass(frozen=True)
class Step:
    """One step: its command, its module, its arguments, whether it needs Spark, its help."""

    name: str  # the `cdc` command and the step name of summaries ("overwrite-final")
    module: str  # spark_jobs.<module>; the task id where a DAG runs it ("overwrite_final")
    kind: ArgumentKind
    help: str
    needs_spark: bool = True
    in_dag: bool = True
    maintenance: bool = False  # a DAG task that runs on its own cadence (`<module>_schedule`)
    # Rewrites the table's files: in a DAG it takes the table's pool (when pools are on), so
    # maintenance never runs beside another run's rewrite. `stage` only appends and stays out.
    pooled: bool = False
    # Its success changes final: the table's asset is its outlet, and in a DAG it skips the
    # maintenance tasks that are not due (they all run after it).
    writes_final: bool = False
    # Its counts (XCom return value) are the run's: rows read, staged, quarantined, written.
    reports_counts: bool = False
    # Its counts are held against max_quarantine_fraction after it runs.
    checks_quarantine: bool = False
    # In a DAG it fails (no retry) when the run's stage went past max_quarantine_fraction with
    # quarantine_action warn, due or not: the run ends in a visible warning state.
    fails_on_quarantine_breach: bool = False
    # Its --start/--end only label its summary (optional on the command line): it applies every
    # staged change not applied yet, whatever the interval.
    interval_is_label: bool = False

    @property
    def body(self) -> str:
        """The name of the body function in the step's module."""
        return f"{self.module}_step"

    @property
    def task_id(self) -> str:
        """The task id of the step in a table's DAG."""
        return self.module


STEPS: tuple[Step, ...] = (
    Step(
        "stage",
        "stage",
        "interval",
        "change sets of [start, end) into staging",
        reports_counts=True,
        checks_quarantine=True,
    ),
    Step(
        "overwrite-final",
        "overwrite_final",
        "interval",
        "rewrite the final partitions the staged changes not applied yet touch",
        pooled=True,
        writes_final=True,
        reports_counts=True,
        interval_is_label=True,
    ),
    Step(
        "reset-staging",
        "reset_staging",
        "table",
        "staging := final + remembered deletes",
        maintenance=True,
        pooled=True,
    ),
    Step(
        "optimize",
        "optimize",
        "table",
        "compact small files, Z-order by zorder_by",
        maintenance=True,
        pooled=True,
    ),
    Step(
        "vacuum",
        "vacuum",
        "vacuum",
        "delete files older than the retention that no version needs",
        needs_spark=False,
        maintenance=True,
        pooled=True,
    ),
    # Last in the DAG, so it verifies what the run and its maintenance left.
    Step(
        "check",
        "check",
        "tables",
        "verify the tables' invariants (every valid table when none is named)",
        maintenance=True,
        fails_on_quarantine_breach=True,
    ),
    Step(
        "as-of",
        "as_of",
        "as_of",
        "the table as it was at --at, from its history (history: true)",
        in_dag=False,
    ),
)

# The XCom key under which a failed step task keeps its one-line reason (the view reads it).
ERROR_XCOM = "cdc_error"
# The XCom key under which `stage` keeps the alert of a run past max_quarantine_fraction with
# quarantine_action warn: the run's `check` task then fails with it (a visible warning state, no
# retry) and the view counts that failure as the quarantine warning, not as a failed run.
QUARANTINE_BREACH_XCOM = "cdc_quarantine_breach"
QUARANTINE_BREACH_PREFIX = "quarantine limit exceeded"
ALL_COUNTS = ("*",)


@dataclass(frozen=True)
class Composite:
    """A command that runs interval steps one after the other in one Spark session and prints
    one summary line of their counts (`cdc run`)."""

    name: str
    steps: tuple[str, ...]  # step names, in the order they run
    help: str
    # The line's counts: (step, keys) in order, each key only if the step reported it;
    # ALL_COUNTS for every count of the step. A key seen again keeps its place, takes the value.
    line: tuple[tuple[str, tuple[str, ...]], ...]

    def counts(self, reported: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The composite's counts from each step's (`reported[step name]`)."""
        counts: dict[str, Any] = {}
        for step, keys in self.line:
            got = reported[step]
            counts.update(got if keys == ALL_COUNTS else {k: got[k] for k in keys if k in got})
        return counts


RUN = Composite(
    "run",
    ("stage", "overwrite-final"),
    "stage + overwrite-final",
    line=(
        # What stage found and did (a snapshot table's stage also says what its extract changed),
        (
            "stage",
            (
                "files",
                "new_files",
                "files_refused",
                "symlinks_refused",
                "unrecognised_entries",
                "files_deferred",
                "files_outside_window",
                "rows_read",
                "staged",
                "quarantined",
                "inserted",
                "updated",
                "deleted",
                "unchanged",
            ),
        ),
        # then everything overwrite-final reports, then the staging version stage committed.
        ("overwrite-final", ALL_COUNTS),
        ("stage", ("staging_version",)),
    ),
)

_BY_NAME = {step.name: step for step in STEPS}
# The DAG task whose counts are held against max_quarantine_fraction ("stage").
QUARANTINE_TASK_ID = next(step.task_id for step in STEPS if step.checks_quarantine)
_BY_MODULE = {step.module: step for step in STEPS}


def step_named(name: str) -> Step:
    """The step of a `cdc` command (`overwrite-final`) or of a module (`overwrite_final`)."""
    found = _BY_NAME.get(name) or _BY_MODULE.get(name)
    if found is None:
        raise KeyError(f"no step named {name!r}; steps: {', '.join(_BY_NAME)}")
    return found


def dag_steps() -> tuple[Step, ...]:
    """The steps a table's DAG runs, in order."""
    return tuple(step for step in STEPS if step.in_dag)


def count_task_ids() -> tuple[str, ...]:
    """The task ids whose XCom return value holds a run's counts (stage, overwrite_final)."""
    return tuple(step.task_id for step in dag_steps() if step.reports_counts)
