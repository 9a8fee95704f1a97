"""One health state per table, decided in one place from plain facts."""

from __future__ import annotations

from datetime import timedelta

from cdc_pipeline.health import HealthFacts, table_health, worst

HOUR = timedelta(hours=1)


def facts(**values: object) -> HealthFacts:
    return HealthFacts(period=HOUR, applied_anything=True, **values)  # type: ignore[arg-type]


def test_lag_warns_after_two_periods_and_errors_after_four() -> None:
    assert table_health(facts(lag=HOUR)).state == "ok"
    warned = table_health(facts(lag=2.5 * HOUR))
    assert (warned.state, warned.reasons) == ("warn", ["2.5 h behind (warn after 2.0 h)"])
    assert table_health(facts(lag=4 * HOUR)).reasons == ["4.0 h behind (error after 4.0 h)"]


def test_the_lag_has_its_own_verdict_whatever_else_the_table_shows() -> None:
    """The view colours Behind by it: a table in error for another reason is not late."""
    assert table_health(facts()).lag == "ok"  # applied, nothing waits
    assert table_health(facts(lag=HOUR)).lag == "ok"
    assert table_health(facts(lag=2.5 * HOUR, unreadable="x")).lag == "warn"
    assert table_health(facts(lag=5 * HOUR)).lag == "error"
    assert table_health(HealthFacts(period=HOUR)).lag == "unknown"  # nothing known


def test_the_rows_freshness_is_the_error_threshold() -> None:
    health = table_health(facts(lag=90 * timedelta(minutes=1), freshness=HOUR))
    assert (health.state, health.reasons) == ("error", ["1.5 h behind (error after 1.0 h)"])


def test_a_table_that_applied_nothing_is_unknown_never_ok() -> None:
    health = table_health(HealthFacts(period=HOUR, lag=HOUR / 2))
    assert (health.state, health.reasons) == (
        "unknown",
        ["nothing applied yet (0.5 h of changes waiting)"],
    )


def test_errors_come_before_warnings_and_every_reason_is_kept() -> None:
    health = table_health(
        facts(
            unreadable="the Delta table final cannot be read",
            files_outside_window=1,
            quarantine_fraction=0.6,
            max_quarantine_fraction=0.05,
            last_run_failed="stage: boom",
            check_breaches=("a key twice",),
            paused_with_waiting=True,
        )
    )
    assert health.state == "error"
    assert health.reasons == [
        "unreadable: the Delta table final cannot be read",
        "last run failed: stage: boom",
        "check breached: a key twice",
        "1 file(s) outside the late-arrival window, never applied: `cdc status` lists them; "
        "`cdc run` over their hour applies them",
        "last stage run quarantined 60.0% of its rows (limit 5.0%)",
        "paused with changes waiting",
    ]
    assert worst(["ok", "unknown", "warn"]) == "warn"
