"""Airflow plugin: the "CDC tables" control room, behind the Airflow login and per-DAG read access.

Per table: how far behind it is (red past its `freshness` deadline), the last run whatever its
state (a failed one with its failed tasks, their one-line reasons and links to their logs), the
attempts of the last runs (a timeline: queued, running with the task and its try, failed after how
many tries) and the backfills in progress (n of m runs done), the quarantine rate against `max_quarantine_fraction` and its top reasons, rows and run time of the
recent runs as inline SVG sparklines, final's newest commits (a timeline: step, files, rows,
time), the latest `cdc check`, whether the DAG is paused, and links into the DAG. The
page reloads itself every minute. Links are relative to the page, so the view also works when
Airflow is served under a sub-path. The handlers that read Delta logs and the metadata DB are
plain `def`s: FastAPI runs them in its thread pool, off the api-server's event loop.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from cdc_airflow.view.runs import Attempt, BackfillProgress, RunPoint
from cdc_airflow.view.status import TIME_FORMAT, Commit, TableStatus, all_table_status
from spark_jobs.status.quarantine import QuarantineReport

PREFIX = "/cdc-tables"
REFRESH_SECONDS = 60
# No /docs, /redoc or /openapi.json: a plugin app is served without Airflow's authentication,
# and these would describe the view to anyone.
app = FastAPI(title="CDC tables", docs_url=None, redoc_url=None, openapi_url=None)


async def current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Any:
    """The logged-in Airflow user (Bearer token or the UI's cookie), or None."""
    try:
        return await get_user(request, None, credentials)
    except HTTPException:
        return None


User = Annotated[Any, Depends(current_user)]


def readable_dag_ids(auth_manager: Any, user: Any, dag_ids: Collection[str]) -> set[str]:
    """The DAG ids among `dag_ids` that the auth manager lets `user` read (GET)."""
    if user is None:
        return set()
    return set(
        auth_manager.filter_authorized_dag_ids(dag_ids=set(dag_ids), user=user, method="GET")
    )


def utc_now() -> datetime:
    """The view's clock (a function, so tests can set it)."""
    return datetime.now(UTC)


def visible_status(user: Any, now: datetime) -> list[TableStatus]:
    """The status of each table whose DAG the user may read (blocking: DB and Delta logs)."""
    from airflow.api_fastapi.app import get_auth_manager

    from cdc_pipeline.config import load_table_configs

    dag_ids = {t.dag_id for t in load_table_configs().tables.values()}
    return all_table_status(readable_dag_ids(get_auth_manager(), user, dag_ids), now=now)


def to_root(request: Request) -> str:
    """The relative path from the requested page up to Airflow's root (`../` from `/cdc-tables/`).

    Counted from the matched route's own path (`/` is one level below the mount, which is one
    below Airflow's root), so it holds under whatever prefix a proxy or `base_url` adds.
    """
    route = request.scope.get("route")
    path = getattr(route, "path", "/") or "/"
    return "../" * max(path.count("/"), 1)


def to_login(request: Request, root: str) -> Response:
    """A relative Location (RFC 9110) to the login page of this Airflow, whatever its sub-path,
    coming back to the page asked for."""
    return RedirectResponse(
        f"{root}api/v2/auth/login?next={quote(request.url.path)}", status_code=307
    )


@app.get("/api/tables")
def tables_json(user: User) -> Response:
    """The view's data as JSON: only tables whose DAG the user may read; 401 without a login."""
    if user is None:
        return JSONResponse({"detail": "Not authenticated"}, status_code=401)
    return JSONResponse([s.as_dict() for s in visible_status(user, utc_now())])


@app.get("/", response_class=HTMLResponse)
def tables_page(request: Request, user: User) -> Response:
    """One row per readable table; sends to Airflow's login page when not logged in."""
    root = to_root(request)
    if user is None:
        return to_login(request, root)
    now = utc_now()
    return HTMLResponse(render_page(visible_status(user, now), root, now))


@app.get("/quarantine/{table}", response_class=HTMLResponse)
def quarantine_page(request: Request, user: User, table: str) -> Response:
    """A table's quarantine: rows per reason and hour, sample rows with their values and source
    file. Only for a user who may read the table's DAG (404 otherwise, as for no such table)."""
    from airflow.api_fastapi.app import get_auth_manager

    from cdc_pipeline.config import load_table_configs
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.status.quarantine import quarantine_report

    root = to_root(request)
    if user is None:
        return to_login(request, root)
    config = load_table_configs().tables.get(table)
    if config is None or not readable_dag_ids(get_auth_manager(), user, {config.dag_id}):
        return HTMLResponse(_page("CDC quarantine", "<p>No such table you may read.</p>"), 404)
    try:
        report = quarantine_report(config.name, TablePaths.for_table(config.name).quarantine)
    except Exception as error:  # a damaged table: say which, keep the page
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        body = f'<p class="bad">quarantine of {_text(table)} unreadable: {_text(text)}</p>'
        return HTMLResponse(_page(f"CDC quarantine: {table}", body))
    return HTMLResponse(_page(f"CDC quarantine: {table}", render_quarantine(report, root)))


# --- rendering -----------------------------------------------------------------------------

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em}
p.note{color:#666;margin:0 0 1em;font-size:.9em}
span.health{font-weight:600;padding:0 .4em;border-radius:3px}
span.health.ok{background:#dfd;color:#060}span.health.warn{background:#ffe6b3;color:#850}
span.health.error{background:#fdd;color:#a00}span.health.unknown{background:#eee;color:#555}
ul.reasons{margin:.2em 0 0 1em;padding:0;font-size:.85em}
table{border-collapse:collapse}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;font-size:.9em}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.late{background:#fde2e1;color:#a40000;font-weight:600}
.fresh{color:#136b13}
.lagging{background:#ffe6b3;color:#850}
.bad{color:#a40000;font-weight:600}
.ok{color:#136b13}
.muted{color:#888}
svg.spark{vertical-align:middle}
td.spark-rows,td.spark-seconds{white-space:nowrap}
svg.spark polyline{fill:none;stroke:#1f6fd1;stroke-width:1.5}
svg.spark circle{fill:#1f6fd1}
svg.spark rect.failed{fill:#d33;fill-opacity:.55}
a{color:#1f6fd1}
.state{display:inline-block;padding:0 5px;border-radius:3px;font-size:.85em;font-weight:600}
.state.success{background:#e3f4e3;color:#136b13}
.state.failed{background:#fde2e1;color:#a40000}
.state.running,.state.queued{background:#e3edfb;color:#1f4f99}
.state.paused{background:#eee;color:#555}
.over{background:#fde2e1;color:#a40000;font-weight:600}
ul.reasons,ul.commits{margin:.2em 0 0;padding-left:1.1em;font-size:.85em}
ul.commits{list-style:none;padding-left:0;margin:0}
ul.commits li{margin-bottom:.25em}
td.commits{min-width:15em;max-width:20em}
ul.attempts{list-style:none;padding-left:0;margin:0;font-size:.85em}
ul.attempts li{margin-bottom:.3em}
td.attempts{min-width:21em;max-width:26em}
td.last-run{min-width:11em;max-width:18em}
"""
HEADERS = [
    "Health",
    "Table",
    "Behind",
    "Last successful interval",
    "Last run",
    "Attempts (newest first)",
    "Rows staged (runs)",
    "Run time (runs)",
    "Quarantine (runs)",
    "Final",
    "Final's commits",
    "Check",
    "Maintenance",
]


def _text(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def sparkline(values: Sequence[float | None], width: int = 120, height: int = 24) -> str:
    """An inline SVG polyline of `values` (None: a gap, drawn as a red bar through the box).

    Self-contained markup: no script, no stylesheet or font from elsewhere.
    """
    known = [v for v in values if v is not None]
    if not known:
        return '<span class="muted">no runs</span>'
    low, high = min(known), max(known)
    span = (high - low) or 1.0
    step = width / max(len(values) - 1, 1)
    points, marks = [], []
    for i, value in enumerate(values):
        x = round(i * step, 1)
        if value is None:
            marks.append(f'<rect class="failed" x="{x - 2}" y="0" width="4" height="{height}"/>')
            continue
        y = round(height - 2 - (value - low) / span * (height - 4), 1)
        points.append(f"{x},{y}")
    last = points[-1].split(",") if points else None
    dot = f'<circle cx="{last[0]}" cy="{last[1]}" r="2"/>' if last else ""
    title = f"min {low:g}, max {high:g}, last {known[-1]:g} over {len(values)} runs"
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="-2 0 {width + 4} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img"><title>{html.escape(title)}</title>'
        f'<polyline points="{" ".join(points)}"/>{dot}{"".join(marks)}</svg>'
    )


def _behind(status: TableStatus) -> tuple[str, str]:
    """Behind, measured by the data: the age of the oldest change landed and not applied (its hour
    folder's start), and the newest change applied with its age (runs as fallback)."""
    fresh = status.freshness
    limit = f" (limit {_text(status.freshness_limit)})" if status.freshness_limit else ""
    behind = fresh.hours_behind
    data = fresh.data
    if data is None:
        text = "never succeeded" if behind is None else f"{behind:.1f} h behind"
    elif data.partitions is not None or data.source_error is not None:
        text = _kafka_behind(data, behind)
    elif data.files_waiting:
        text = f"{behind or 0:.1f} h behind: {data.files_waiting} file(s) waiting"
        if data.oldest_change is not None:
            text += f", changes from {data.oldest_change:%Y-%m-%d %H:%M}Z on"
    elif behind is None:
        text = "no data applied yet"
    else:
        text = "0.0 h behind: every landed file applied"
    if data is not None and data.newest_change is not None:
        age = data.newest_change_hours or 0.0
        text += f"<br>newest change applied {data.newest_change:%Y-%m-%d %H:%M}Z ({age:.1f} h ago)"
    if data is not None and data.files_outside_window:
        text += (
            f"<br>{data.files_outside_window} file(s) outside the late-arrival window, not "
            "applied: see `cdc status`"
        )
        for found in data.outside_files[:3]:
            text += f"<br><code>{_text(found.path)}</code>: <code>{_text(found.apply_with)}</code>"
    if fresh.overdue:
        deadline = f"<br>past deadline {fresh.deadline:%Y-%m-%d %H:%M}Z" if fresh.deadline else ""
        return "late", f"{text}{limit}{deadline}"
    # No freshness deadline passed, but the lag may be past the health thresholds (2 and 4
    # schedule periods by default): the cell says so as the health column does.
    if status.health.lag == "error":
        return "late", f"{text}{limit}"
    if status.health.lag == "warn":
        return "lagging", f"{text}{limit}"
    return ("fresh" if fresh.hours_behind is not None else "muted"), f"{text}{limit}"


def _kafka_behind(data: Any, behind: float | None) -> str:
    """A Kafka table's lag: messages in its topic not staged, staged ranges not applied."""
    if data.source_error is not None:
        return f"{behind or 0:.1f} h behind; topic unreadable: {html.escape(data.source_error)}"
    waiting = f"{data.messages_waiting} message(s) waiting in {data.partitions} partition(s)"
    if data.files_waiting:
        waiting += f", {data.files_waiting} staged range(s) not applied"
    if not data.messages_waiting and not data.files_waiting:
        return "0.0 h behind: every message staged and applied"
    return f"{behind or 0:.1f} h behind: {waiting}"


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime(TIME_FORMAT)


def _last_run(run: RunPoint | None, dag: str) -> str:
    """The latest run whatever its state: state, when, counts; a failed one's tasks with their
    reasons and links to their logs."""
    if run is None:
        return '<span class="muted">none</span>'
    link = f"{dag}/runs/{quote(run.run_id, safe='')}"
    head = (
        f'<span class="state {_text(run.state)}">{_text(run.state)}</span> '
        f'<a href="{link}" target="_top">{_text(_when(run.started))}</a>'
    )
    if not run.finished:
        return head
    parts = [
        ("files", run.files),
        ("read", run.rows_read),
        ("staged", run.staged),
        ("quarantined", run.quarantined),
        ("changes", run.changes),
        ("written", run.rows_written),
        ("partitions", run.partitions_rewritten),
    ]
    counts = ", ".join(f"{name} {value}" for name, value in parts if value is not None)
    took = f" in {run.seconds:.0f} s" if run.seconds is not None else ""
    failures = "".join(
        f'<br><a class="bad" href="{link}/tasks/{quote(task, safe="")}" target="_top">'
        f"{_text(task)}</a>: {_text(reason or 'see its log')}"
        for task, reason in run.failures
    )
    return f"{head}<br>{_text(counts or 'no counts')}{took}{failures}"


TIMELINE_RUNS = 5  # runs in the attempts timeline, besides the queued ones (one line for all)
WAITING_STATES = ("queued", "scheduled")


def _elapsed(seconds: float) -> str:
    """`45s`, `1m20s`, `2h05m`."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _tries(count: int) -> str:
    return f"{count} {'try' if count == 1 else 'tries'}"


def attempt_text(attempt: Attempt, now: datetime) -> str:
    """One task's attempt as the on-call engineer reads it: `overwrite_final try 2 of 3, running
    1m20s`, `stage failed after 3 tries`, `stage try 1 of 3 failed, retrying`."""
    task, tried = attempt.task_id, f"try {attempt.try_number} of {attempt.tries}"
    if attempt.state == "failed":
        if attempt.try_number >= attempt.tries:
            return f"{task} failed after {_tries(attempt.try_number)}"
        return f"{task} failed at {tried}, not retried"
    if attempt.state == "up_for_retry":
        return f"{task} {tried} failed, retrying"
    if attempt.state == "up_for_reschedule":
        return f"{task} {tried} waiting to be rescheduled"
    if attempt.state in WAITING_STATES or attempt.started is None:
        return f"{task} {attempt.state}, {tried}"
    verb = "running" if attempt.state in ("running", "restarting") else attempt.state
    return f"{task} {tried}, {verb} {_elapsed((now - attempt.started).total_seconds())}"


def interval_text(start: datetime | None, end: datetime | None) -> str:
    """`[2024-01-01 02:00, 03:00)`: the end's date only when it differs from the start's."""
    if start is None or end is None:
        return "no interval"
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    shown = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    return f"[{start:%Y-%m-%d %H:%M}, {shown})"


def _run_line(run: RunPoint, dag: str, now: datetime) -> str:
    """One run of the timeline: its state, type and interval (linking to the run), then what
    its tasks do or did."""
    link = f"{dag}/runs/{quote(run.run_id, safe='')}"
    head = (
        f'<span class="state {_text(run.state)}">{_text(run.state)}</span> '
        f'<a href="{link}" target="_top">{_text(run.run_type or "run")} '
        f"{_text(interval_text(run.interval_start, run.interval_end))}</a>"
    )
    details = []
    for attempt in run.attempts:
        text = _text(attempt_text(attempt, now))
        if attempt.reason and attempt.state == "up_for_retry":
            short = attempt.reason[: REASON_CHARS - 1] + "…"
            reason = attempt.reason if len(attempt.reason) <= REASON_CHARS else short
            text += f': <span title="{_text(attempt.reason)}">{_text(reason)}</span>'
        task_link = f"{link}/tasks/{quote(attempt.task_id, safe='')}"
        tried = f"?try_number={attempt.try_number}" if attempt.try_number else ""
        css = ' class="bad"' if attempt.state in ("failed", "up_for_retry") else ""
        details.append(f'<a{css} href="{task_link}{tried}" target="_top">{text}</a>')
    if run.state == "success" and run.seconds is not None:
        details.append(f"in {run.seconds:.0f} s")
    elif run.state == "running" and not run.attempts:
        details.append("waiting for its first task")
    return f"<li>{head}{'<br>' if details else ''}{'<br>'.join(details)}</li>"


def _queued_line(queued: Sequence[RunPoint]) -> str:
    """The runs requested and not started, as one line: how many, of which type, the next one."""
    kinds = sorted({r.run_type or "run" for r in queued})
    first = min(queued, key=lambda r: r.interval_start or datetime.max.replace(tzinfo=UTC))
    return (
        f'<li><span class="state queued">queued</span> {len(queued)} '
        f"{_text('/'.join(kinds))} run{'s' if len(queued) > 1 else ''}, next "
        f"{_text(interval_text(first.interval_start, first.interval_end))}</li>"
    )


def backfill_text(backfill: BackfillProgress) -> str:
    """`backfill 3 of 8 runs done: 1 failed, 1 running, 4 queued`, and the dates it skipped."""
    counts = [
        f"{backfill.states.get(state, 0)} {state}"
        for state in ("failed", "running", "queued")
        if backfill.states.get(state)
    ]
    if backfill.skipped:
        counts.append(f"{backfill.skipped} date{'s' if backfill.skipped > 1 else ''} skipped")
    return f"backfill {backfill.summary}" + (f": {', '.join(counts)}" if counts else "")


def _backfill_line(backfill: BackfillProgress) -> str:
    paused = ' <span class="state paused">paused</span>' if backfill.paused else ""
    return (
        f'<li class="backfill"><b>{_text(backfill_text(backfill))}</b>{paused}<br>'
        f'<span class="muted">dates {_when(backfill.from_date)} to '
        f"{_when(backfill.to_date)}</span></li>"
    )


def _attempts(status: TableStatus, dag: str, now: datetime) -> str:
    """The timeline of the last runs, newest first (like Hudi's requested, inflight, completed):
    the backfills in progress, the queued runs as one line, then each run with what its tasks
    do or did (the task running and its try, the task failed and after how many tries)."""
    queued = [r for r in status.runs if r.state == "queued"]
    others = [r for r in status.runs if r.state != "queued"][::-1][:TIMELINE_RUNS]
    lines = [_backfill_line(b) for b in status.backfills]
    if queued:
        lines.append(_queued_line(queued))
    lines.extend(_run_line(r, dag, now) for r in others)
    if not lines:
        return '<span class="muted">no runs yet</span>'
    return f'<ul class="attempts">{"".join(lines)}</ul>'


def _check(status: TableStatus) -> str:
    check = status.check
    if check is None:
        return '<span class="muted">not checked</span>'
    checked = _text(_iso_text(check.checked_at))
    if check.ok:
        return f'<span class="ok">ok</span> <span class="muted">{checked}</span>'
    more = f" (+{len(check.breaches) - 1} more)" if len(check.breaches) > 1 else ""
    return (
        f'<span class="bad">breach</span>: {_text(check.first_breach)}{_text(more)} '
        f'<span class="muted">{checked}</span>'
    )


def _iso_text(text: str) -> str:
    """An ISO 8601 time written by a step, in the view's one format (as it is if not one)."""
    try:
        return _when(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return text


def _latest(values: Sequence[float | None], unit: str) -> str:
    known = [v for v in values if v is not None]
    return f' <span class="muted">{known[-1]:,.0f}{unit}</span>' if known else ""


def _quarantine(status: TableStatus) -> str:
    """Rows quarantined over the recent runs as a rate of the rows read (red past the row's
    max_quarantine_fraction), and what the quarantine table holds."""
    held = status.quarantined_rows or 0
    if status.quarantine_growth is None:
        return f"{held:,} held"
    finished = sum(1 for r in status.runs if r.finished)
    text = f"+{status.quarantine_growth:,} over {finished} runs, {held:,} held"
    rate, limit = status.quarantine_rate, status.max_quarantine_fraction
    if rate is None:
        return text
    limit_text = f" (limit {limit:.1%})" if limit is not None else ""
    css = "over" if status.quarantine_over_limit else "muted"
    return f'{text}<br><span class="{css}">{rate:.1%} of rows read{limit_text}</span>'


REASON_CHARS = 90


def _drill_down(status: TableStatus) -> str:
    """The link to the table's quarantine page, when it holds rows."""
    if not status.quarantined_rows:
        return ""
    return f'<a class="muted" href="quarantine/{quote(status.name)}">rows and sources</a>'


def _reasons(status: TableStatus) -> str:
    """The most frequent reasons among the rows held (quoted values left out), long ones cut
    with the whole text as the tooltip."""
    if not status.top_reasons:
        return ""
    items = []
    for reason, rows in status.top_reasons:
        short = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"
        items.append(f'<li title="{_text(reason)}">{rows:,} rows: {_text(short)}</li>')
    return f'<ul class="reasons">{"".join(items)}</ul>'


def _commit(commit: Commit) -> str:
    files = (
        ""
        if commit.files_added is None
        else f", +{commit.files_added} -{commit.files_removed} files, {commit.rows_added:,} rows"
    )
    took = "" if commit.seconds is None else f", {commit.seconds:.0f}&nbsp;s"
    return f"<li>v{commit.version} {_text(_when(commit.at))} {_text(commit.operation)}{files}{took}</li>"


def _commits(status: TableStatus) -> str:
    """Final's newest commits, newest first, like Hudi's timeline."""
    if not status.commits:
        return '<span class="muted">none</span>'
    return f'<ul class="commits">{"".join(_commit(c) for c in status.commits)}</ul>'


def _final(status: TableStatus) -> str:
    if status.final_rows is None:
        return '<span class="muted">no table yet</span>'
    staging = "" if status.staging_rows is None else f", staging {status.staging_rows:,}"
    return (
        f"{status.final_rows:,} rows<br>"
        f'<span class="muted">v{_text(status.final_version)}{staging}</span>'
    )


def render_row(status: TableStatus, root: str, *, now: datetime | None = None) -> str:
    """One table's row; every link is relative (`root` leads from the page to Airflow's root);
    `now` (default: the clock) times the attempts going on."""
    dag = f"{root}dags/{quote(status.dag_id)}"
    name = _text(status.name)
    behind_class, behind = _behind(status)
    runs = [r for r in status.runs if r.finished]  # the sparklines: finished runs by start
    staged = [float(r.staged) if r.staged is not None else None for r in runs]
    seconds = [r.seconds if r.state == "success" else None for r in runs]
    quarantined = [float(r.quarantined) if r.quarantined is not None else None for r in runs]
    failed = sum(1 for r in runs if r.state == "failed")
    cells = [
        _health_cell(status),
        f'<td><a href="{dag}" target="_top">{name}</a>'
        + (' <span class="state paused">paused</span>' if status.paused else "")
        + f'<br><a class="muted" href="{dag}/runs" target="_top">runs</a>'
        + (f' <span class="bad">{failed} failed</span>' if failed else "")
        + (f'<br><span class="bad">{_text(status.problem)}</span>' if status.problem else "")
        + "</td>",
        f'<td class="{behind_class}" data-hours="{_text(status.freshness.hours_behind)}">{behind}</td>',
        f"<td>{_text(status.last_success_interval or '-')}</td>",
        f'<td class="last-run">{_last_run(status.last_run, dag)}</td>',
        f'<td class="attempts">{_attempts(status, dag, now or utc_now())}</td>',
        f'<td class="spark-rows">{sparkline(staged)}{_latest(staged, "")}</td>',
        f'<td class="spark-seconds">{sparkline(seconds)}{_latest(seconds, " s")}</td>',
        f'<td class="quarantine">{sparkline(quarantined)}<br>{_quarantine(status)}'
        f"{_reasons(status)}{_drill_down(status)}</td>",
        f'<td class="num">{_final(status)}</td>',
        f'<td class="commits">{_commits(status)}</td>',
        f'<td class="check">{_check(status)}</td>',
        f'<td class="muted">optimize {_text(status.last_optimize or "-")}<br>'
        f"vacuum {_text(status.last_vacuum or '-')}<br>reset {_text(status.last_reset or '-')}</td>",
    ]
    return f'<tr id="table-{name}">{"".join(cells)}</tr>'


def _health_cell(status: TableStatus) -> str:
    """The table's one health state and its reasons (the same as `cdc status`)."""
    state = status.health.state
    reasons = "".join(f"<li>{_text(r)}</li>" for r in status.health.reasons)
    listed = f'<ul class="reasons">{reasons}</ul>' if reasons else ""
    return f'<td class="health"><span class="health {state}">{state}</span>{listed}</td>'


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_text(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{_text(title)}</h1>{body}</body></html>"
    )


def render_quarantine(report: QuarantineReport, root: str) -> str:
    """The drill-down's body: totals per reason, rows per hour and reason, sample rows (values
    escaped, long ones cut by the report)."""
    back = f'<p class="note"><a href="{root}cdc-tables/">all tables</a></p>'
    if not report.total:
        return back + "<p>Nothing quarantined.</p>"
    reasons = "".join(
        f"<tr><td>{_text(reason)}</td><td class='num'>{rows:,}</td></tr>"
        for reason, rows in report.by_reason()
    )
    hours = "".join(
        f"<tr><td>{_text(batch)}</td><td>{_text(reason)}</td><td class='num'>{rows:,}</td></tr>"
        for batch, reason, rows in report.counts
    )
    samples = "".join(
        f"<tr><td>{_text(s.batch)}</td><td>{_text(s.file)}</td><td class='num'>{_text(s.row)}</td>"
        f"<td>{_text(s.reason)}</td><td><code>{_text(s.shown_values())}</code></td></tr>"
        for s in report.samples
    )
    return (
        back
        + f'<p id="quarantine-total">{report.total:,} rows held.</p>'
        + "<h2>By reason</h2><table id='by-reason'><thead><tr><th>reason</th><th>rows</th>"
        + f"</tr></thead><tbody>{reasons}</tbody></table>"
        + "<h2>By hour, newest first</h2><table id='by-hour'><thead><tr><th>hour</th>"
        + f"<th>reason</th><th>rows</th></tr></thead><tbody>{hours}</tbody></table>"
        + f"<h2>Sample rows of the newest {report.batches_read} hour(s)</h2>"
        + "<table id='samples'><thead><tr><th>hour</th><th>file</th><th>_cdc_row</th>"
        + f"<th>reason</th><th>values</th></tr></thead><tbody>{samples}</tbody></table>"
    )


def render_page(statuses: Sequence[TableStatus], root: str, now: datetime) -> str:
    """The whole page: self-contained HTML (inline CSS and SVG, no script)."""
    head = "".join(f"<th>{title}</th>" for title in HEADERS)
    rows = "".join(render_row(s, root, now=now) for s in statuses) or (
        f'<tr><td colspan="{len(HEADERS)}" class="muted">No table you may read.</td></tr>'
    )
    states = Counter(s.health.state for s in statuses)
    late = sum(1 for s in statuses if s.freshness.overdue)
    summary = (
        f"{len(statuses)} tables: {states['error']} error, {states['warn']} warn, "
        f"{states['ok']} ok, {states['unknown']} unknown; {late} past their freshness deadline"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>CDC tables</title>"
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<style>{STYLE}</style></head><body><h1>CDC tables</h1>"
        f'<p class="note" id="summary">{_text(summary)}; as of {_when(now)}, reloads every '
        f"{REFRESH_SECONDS} s. Sparklines: the last finished runs by start time, oldest left "
        "(a red bar: no value, e.g. a failed run).</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></body></html>"
    )


class CdcTablesPlugin(AirflowPlugin):
    """Adds the CDC tables view to the Airflow UI (Browse menu)."""

    name = "cdc_tables"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "CDC tables"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "CDC tables",
            "href": f"{PREFIX}/",
            "url_route": "cdc-tables",
            "category": "browse",
        }
    ]
