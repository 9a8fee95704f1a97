"""The CDC tables view in a real browser with a table in each health state, screenshots kept.

Each table is made by the real `cdc` (a client of the session's Connect server) on real Delta
tables: applied and quiet (ok), 3 of 5 rows quarantined (warn), a late file in an old hour of the
window (warn: lag by the hour it holds), a file outside the window (warn), a damaged log (error),
a failed last run (error: the run as the metadata DB would give it, its stage failed after 3
tries), a backfill going on (ok: 3 of 8 runs done, overwrite_final running its second try),
nothing applied (unknown).
The view's app is served by uvicorn in this process with a logged-in user (the login and the
per-DAG access have their own tests); headless Chromium loads it. The screenshots of the page, of
each row and of the quarantine drill-down go to test-artifacts/view-states/."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_airflow.local.connect_server import free_port
from cdc_airflow.view.runs import Attempt, BackfillProgress, RunPoint
from tests.cli.cdc import cdc
from tests.e2e.browser import artifacts_folder, chromium
from tests.e2e.test_airflow import row as airflow_row
from tests.helpers import Workspace

pytestmark = [pytest.mark.cli, pytest.mark.slow]


def row(name: str, **extra: Any) -> dict[str, Any]:
    """The e2e tables' row (ID, VALUE, TS), looking 12 hours back for late files."""
    return {**airflow_row(name), "late_arrival_window": "12h", **extra}


def changes(hour: datetime, *ids: int | None) -> list[dict[str, Any]]:
    ts = f"{hour:%Y-%m-%d %H}:00:01"
    return [{"FLAG": "I", "ID": i, "VALUE": 1, "TS": ts} for i in ids]


def hour_id(hour: datetime) -> str:
    return f"{hour:%Y-%m-%dT%H}"


def apply(ws: Workspace, table: str, hour: datetime, *ids: int | None) -> None:
    ws.land(table, hour_id(hour), "a.csv", changes(hour, *ids))
    end = hour + timedelta(hours=1)
    result = cdc(
        ws,
        "run",
        table,
        "--start",
        f"{hour:%Y-%m-%dT%H}:00:00Z",
        "--end",
        f"{end:%Y-%m-%dT%H}:00:00Z",
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture
def states(workspace: Workspace) -> tuple[Workspace, datetime]:
    """One table per state, its hours a few hours before now (inside the 12h window)."""
    now = datetime.now(UTC)
    base = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    workspace.configure(
        row("s_ok"),
        row("s_quarantine"),
        # Warn after 2 h (2 hourly periods), error after 6 h: its 3-4 h lag stays a warning
        # whenever in the hour the test runs.
        row("s_late", freshness="6h"),
        row("s_outside"),
        row("s_damaged"),
        row("s_failed"),
        row("s_backfill"),
        row("s_unknown"),
    )
    for table in ("s_ok", "s_late", "s_outside", "s_damaged", "s_failed", "s_backfill"):
        apply(workspace, table, base, 1, 2)
    apply(workspace, "s_quarantine", base, 1, 2, None, None, None)
    # A late file in the applied hour's folder: its changes are 3 h old, whenever it landed.
    workspace.land("s_late", hour_id(base), "late.csv", changes(base, 3))
    # A file in an hour 20 h back: outside the 12h window, never staged by any run.
    workspace.land("s_outside", hour_id(base - timedelta(hours=17)), "old.csv", changes(base, 3))
    log = workspace.paths("s_damaged").final / "_delta_log"
    newest = max(log.glob("*.json"))
    newest.write_text(newest.read_text()[:40])  # truncated mid-record
    return workspace, now


BACKFILL_START = datetime(2024, 1, 1, tzinfo=UTC)


def backfill_runs(now: datetime) -> list[RunPoint]:
    """A backfill of 8 hours, oldest first: 3 runs succeeded, the 4th runs overwrite_final's
    second try (for 1m20s), 4 queued."""
    runs = []
    for hour in range(8):
        state = "success" if hour < 3 else "running" if hour == 3 else "queued"
        attempts = (
            (
                Attempt(
                    task_id="overwrite_final",
                    state="running",
                    try_number=2,
                    tries=3,
                    started=now - timedelta(seconds=80),
                ),
            )
            if state == "running"
            else ()
        )
        runs.append(
            RunPoint(
                f"backfill__2024-01-01T{hour:02d}:00:00+00:00",
                state,
                BACKFILL_START + timedelta(hours=hour),
                BACKFILL_START + timedelta(hours=hour + 1),
                30.0 + hour if state == "success" else None,
                started=now - timedelta(minutes=30 - 5 * min(hour, 4)),
                run_type="backfill",
                backfill_id=1,
                attempts=attempts,
            )
        )
    return runs


@pytest.fixture
def served(states: tuple[Workspace, datetime], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The view's app on a free port, every table readable, s_failed's last run failed after
    its retries, s_backfill's backfill going on."""
    import uvicorn
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi import FastAPI

    from cdc_airflow.view import plugin as view
    from cdc_airflow.view import status as table_status

    _, now = states
    reason = "error: stage s_failed: no flag column FLAG in a.csv"
    failed = RunPoint(
        "scheduled__failed",
        "failed",
        now - timedelta(hours=2),
        now - timedelta(hours=1),
        12.0,
        started=now - timedelta(minutes=50),
        failures=(("stage", reason),),
        run_type="scheduled",
        attempts=(Attempt(task_id="stage", state="failed", try_number=3, tries=3, reason=reason),),
    )
    # The view's clock stops here: the try going on has run 1m20s when the page is read.
    clock = datetime.now(UTC)
    monkeypatch.setattr(view, "utc_now", lambda: clock)
    runs = {"cdc_s_failed": [failed], "cdc_s_backfill": backfill_runs(clock)}
    progress = BackfillProgress(
        backfill_id=1,
        from_date=BACKFILL_START,
        to_date=BACKFILL_START + timedelta(hours=7),
        states={"success": 3, "running": 1, "queued": 4},
    )
    monkeypatch.setattr(
        table_status, "recent_runs", lambda dag_ids: {d: runs.get(d, []) for d in dag_ids}
    )
    monkeypatch.setattr(table_status, "paused_dags", lambda dag_ids: set())
    monkeypatch.setattr(
        table_status,
        "active_backfills",
        lambda dag_ids: {d: [progress] if d == "cdc_s_backfill" else [] for d in dag_ids},
    )
    monkeypatch.setattr(view, "readable_dag_ids", lambda _manager, _user, ids: set(ids))
    monkeypatch.setattr("airflow.api_fastapi.app.get_auth_manager", lambda: None)
    view.app.dependency_overrides[view.current_user] = lambda: SimpleAuthManagerUser(
        username="oncall", role="viewer"
    )
    parent = FastAPI()
    parent.mount("/cdc-tables", view.app)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(parent, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}/cdc-tables/"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        view.app.dependency_overrides.clear()


EXPECTED = {
    "s_ok": ("ok", []),
    "s_quarantine": ("warn", ["last stage run quarantined 60.0% of its rows (limit 5.0%)"]),
    # 3.x h behind, or 4.0 when the hour turns between landing and reading (the runs take minutes)
    "s_late": ("warn", [" h behind (warn after 2.0 h)"]),
    "s_outside": ("warn", ["1 file(s) outside the late-arrival window, never applied"]),
    "s_damaged": ("error", ["unreadable: the Delta table ", " cannot be read ("]),
    "s_failed": ("error", ["last run failed: stage: error: stage s_failed: no flag column FLAG"]),
    "s_backfill": ("ok", []),
    "s_unknown": ("unknown", ["nothing applied yet"]),
}


def test_each_health_state_in_a_real_browser(
    served: str, states: tuple[Workspace, datetime], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    artifacts = artifacts_folder("view-states")
    driver = chromium(tmp_path / "chromium", width=1900, height=1400)
    try:
        driver.get(served)
        summary = driver.find_element(By.ID, "summary").text
        assert summary.startswith("8 tables: 2 error, 3 warn, 2 ok, 1 unknown; "), summary
        driver.save_screenshot(str(artifacts / "page.png"))
        for table, (state, parts) in EXPECTED.items():
            element = driver.find_element(By.ID, f"table-{table}")
            health = element.find_element(By.CSS_SELECTOR, "td.health")
            lines = health.text.splitlines()
            assert lines[0] == state, (table, lines)
            reasons = " | ".join(lines[1:])
            assert all(part in reasons for part in parts), (table, reasons)
            if not parts:
                assert lines == [state], (table, lines)
            # In view first: a row above the scrolled-to part is cropped from the wrong place.
            driver.execute_script("arguments[0].scrollIntoView();", element)
            element.screenshot(str(artifacts / f"row-{table}.png"))
        late_health = driver.find_element(By.CSS_SELECTOR, "#table-s_late td.health").text
        assert late_health.splitlines()[1].startswith(("3.", "4.0 ")), late_health
        late = driver.find_element(By.ID, "table-s_late").text
        assert "1 file(s) waiting, changes from " in late and "newest change applied " in late
        # No freshness deadline, but past the warn threshold: the Behind cell says so too.
        behind = driver.find_element(By.CSS_SELECTOR, "#table-s_late td:nth-child(3)")
        assert behind.get_attribute("class") == "lagging", behind.get_attribute("outerHTML")
        # The attempts: the backfill's progress, its queued runs, the try going on, the runs
        # done; the failed run's task and its tries; a table without runs says so.
        attempts = driver.find_element(By.CSS_SELECTOR, "#table-s_backfill td.attempts")
        lines = attempts.text.splitlines()
        print("\nthe attempts of s_backfill:\n" + "\n".join(lines))
        assert lines[:2] == [
            "backfill 3 of 8 runs done: 1 running, 4 queued",
            "dates 2024-01-01 00:00Z to 2024-01-01 07:00Z",
        ]
        assert lines[2] == "queued 4 backfill runs, next [2024-01-01 04:00, 05:00)"
        assert lines[3] == "running backfill [2024-01-01 03:00, 04:00)"
        assert lines[4] == "overwrite_final try 2 of 3, running 1m20s"
        assert lines[5:] == [
            "success backfill [2024-01-01 02:00, 03:00)",
            "in 32 s",
            "success backfill [2024-01-01 01:00, 02:00)",
            "in 31 s",
            "success backfill [2024-01-01 00:00, 01:00)",
            "in 30 s",
        ]
        failed = driver.find_element(By.CSS_SELECTOR, "#table-s_failed td.attempts").text
        assert failed.splitlines()[1] == "stage failed after 3 tries", failed
        quiet = driver.find_element(By.CSS_SELECTOR, "#table-s_ok td.attempts").text
        assert quiet == "no runs yet"
        outside = driver.find_element(By.ID, "table-s_outside").text
        assert "old.csv" in outside and "cdc run s_outside --start " in outside
        # The quarantine drill-down, from its link: the rows, their reason, file and row.
        driver.find_element(By.CSS_SELECTOR, "#table-s_quarantine a[href^='quarantine/']").click()
        assert driver.find_element(By.ID, "quarantine-total").text == "3 rows held."
        samples = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#samples tbody tr")]
        assert len(samples) == 3 and all(
            "a.csv" in s and "null key column ID" in s for s in samples
        )
        assert "ID=null" in samples[0]
        driver.save_screenshot(str(artifacts / "quarantine-s_quarantine.png"))
    finally:
        driver.quit()
