"""One health state per table (ok, warn, error, unknown) with its reasons, from plain facts.

The one place the state is decided: `cdc status --json`, the CDC tables view, its header and
the alerts all read it. Like dbt's source freshness, data lag has a warn and an error threshold,
by default 2 and 4 of the table's schedule periods (an hourly table warns at 2 h behind, errors
at 4 h); the row's `freshness`, when set, is the error threshold. Lag is measured by the data:
the age of the oldest change waiting (not staged or not applied). A table that has applied
nothing yet and shows no failure is `unknown`, never `ok`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

State = Literal["ok", "warn", "error", "unknown"]
WARN_PERIODS = 2
ERROR_PERIODS = 4
_RANK = {"unknown": 0, "ok": 1, "warn": 2, "error": 3}


@dataclass(frozen=True, kw_only=True)
class HealthFacts:
    """What is known of one table now; None where it is not known (the CLI knows no run)."""

    period: timedelta  # the schedule's interval
    freshness: timedelta | None = None  # the row's deadline: the error threshold when set
    lag: timedelta | None = None  # age of the oldest change waiting; None: nothing waits
    applied_anything: bool = False
    files_outside_window: int = 0
    outside_apply_with: str | None = None  # the command applying the oldest of them
    unreadable: str | None = None  # a table whose log cannot be read: which, and why
    source_error: str | None = None  # the Kafka broker could not be asked
    check_breaches: tuple[str, ...] = ()
    quarantine_fraction: float | None = None  # of the last stage run
    max_quarantine_fraction: float | None = None
    last_run_failed: str | None = None  # the failed task and its reason (Airflow)
    paused_with_waiting: bool = False  # the DAG is paused and changes wait (Airflow)


@dataclass(frozen=True)
class Health:
    """The state and every reason for it, worst first."""

    state: State
    reasons: list[str] = field(default_factory=list)
    # The data lag's own verdict (ok, warn or error by the thresholds; unknown: nothing waits and
    # nothing is known), which the view's Behind cell is coloured by.
    lag: State = "unknown"

    def document(self) -> dict[str, object]:
        """As plain JSON data."""
        return {"state": self.state, "reasons": list(self.reasons)}


def _hours(value: timedelta) -> str:
    return f"{value.total_seconds() / 3600:.1f} h"


def thresholds(facts: HealthFacts) -> tuple[timedelta, timedelta]:
    """(warn after, error after) for the data lag."""
    error_after = facts.freshness or facts.period * ERROR_PERIODS
    warn_after = min(facts.period * WARN_PERIODS, error_after)
    return warn_after, error_after


def table_health(facts: HealthFacts) -> Health:
    """The table's one state, with its reasons (errors, then warnings)."""
    errors: list[str] = []
    warnings: list[str] = []
    if facts.unreadable:
        errors.append(f"unreadable: {facts.unreadable}")
    if facts.last_run_failed:
        errors.append(f"last run failed: {facts.last_run_failed}")
    for breach in facts.check_breaches:
        errors.append(f"check breached: {breach}")
    if facts.source_error:
        errors.append(f"source unreadable: {facts.source_error}")
    warn_after, error_after = thresholds(facts)
    lag: State = "ok" if facts.lag is not None or facts.applied_anything else "unknown"
    if facts.lag is not None and facts.lag >= error_after:
        errors.append(f"{_hours(facts.lag)} behind (error after {_hours(error_after)})")
        lag = "error"
    elif facts.lag is not None and facts.lag >= warn_after:
        warnings.append(f"{_hours(facts.lag)} behind (warn after {_hours(warn_after)})")
        lag = "warn"
    if facts.files_outside_window:
        fix = f"`{facts.outside_apply_with}`" if facts.outside_apply_with else "`cdc run`"
        warnings.append(
            f"{facts.files_outside_window} file(s) outside the late-arrival window, never "
            f"applied: `cdc status` lists them; {fix} over their hour applies them"
        )
    limit, fraction = facts.max_quarantine_fraction, facts.quarantine_fraction
    if limit is not None and fraction is not None and fraction > limit:
        warnings.append(
            f"last stage run quarantined {fraction:.1%} of its rows (limit {limit:.1%})"
        )
    if facts.paused_with_waiting:
        warnings.append("paused with changes waiting")
    if errors:
        return Health("error", errors + warnings, lag)
    if warnings:
        return Health("warn", warnings, lag)
    if not facts.applied_anything:
        waiting = "" if facts.lag is None else f" ({_hours(facts.lag)} of changes waiting)"
        return Health("unknown", [f"nothing applied yet{waiting}"], lag)
    return Health("ok", [], lag)


def worst(states: list[State]) -> State:
    """The worst of several states (the header's)."""
    return max(states, key=lambda s: _RANK[s], default="unknown")
