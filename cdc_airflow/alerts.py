"""Alerts of the CDC DAGs: the notifier registry, failure and deadline callbacks, the quarantine check.

A config row names its notifiers (`notify: [ops_email]`); what each name means is the
deployment's business, kept out of the config table (config is data, never code): the Airflow
Variable `cdc_notifiers` maps each name to a kind and its options, for example

    {"ops_email": {"kind": "smtp", "to": "ops@example.com"},
     "ops_hook": {"kind": "webhook", "conn_id": "ops_webhook"},
     "audit": {"kind": "jsonl", "path": "/var/log/cdc/alerts.jsonl"}}

Kinds: `jsonl` (append one JSON line per alert to a file), `smtp` (Airflow's SMTP provider),
`webhook` (POST the alert as JSON through the HTTP provider's `HttpNotifier` to an Airflow HTTP
connection, its port, auth and extra headers included; `endpoint` and `headers` optional), and any kind a
package registers under the entry point group `cdc_pipeline.notifiers` (a factory taking the
options and returning a callable of one Alert). Names are resolved when an alert is sent, in the
worker, so parsing the DAGs never reads the Variable. A notifier that fails is logged; it never
hides the task's own failure.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier

from cdc_pipeline.columns import REASON
from cdc_pipeline.counts import StageCounts, count
from cdc_pipeline.paths import Location, as_location
from spark_jobs.runtime.storage import store_for

log = logging.getLogger(__name__)
REGISTRY_VARIABLE = "cdc_notifiers"
ENVIRONMENT_VARIABLE = "AIRFLOW_VAR_CDC_NOTIFIERS"
ENTRY_POINT_GROUP = "cdc_pipeline.notifiers"
Sender = Callable[["Alert"], None]


@dataclass(frozen=True)
class Alert:
    """One thing an operator should know about a table, as plain JSON-able data."""

    kind: str  # task_failed | deadline_missed | quarantine
    table: str
    dag_id: str
    run_id: str
    message: str
    task_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def subject(self) -> str:
        """A one-line title, e.g. for a mail subject."""
        where = f"{self.dag_id}.{self.task_id}" if self.task_id else self.dag_id
        return f"[cdc] {self.kind} {where} {self.run_id}"


class NotifierError(ValueError):
    """A notifier name or its registry entry is unusable (says which and why)."""


def _jsonl_sender(options: Mapping[str, Any]) -> Sender:
    path = Path(str(options["path"]))

    def send(alert: Alert) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open(
            "a"
        ) as out:  # one line per alert: appends of concurrent tasks interleave whole
            out.write(json.dumps(asdict(alert), default=str) + "\n")

    return send


def _smtp_sender(options: Mapping[str, Any]) -> Sender:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    def send(alert: Alert) -> None:
        body = f"<pre>{json.dumps(asdict(alert), indent=2, default=str)}</pre>"
        notifier = SmtpNotifier(
            to=options["to"],
            smtp_conn_id=options.get("conn_id", "smtp_default"),
            subject=alert.subject(),
            html_content=body,
        )
        notifier.notify({})

    return send


def _webhook_sender(options: Mapping[str, Any]) -> Sender:
    """POST the alert as JSON through the HTTP provider's notifier: the connection's scheme,
    host, port, login/password and extra headers all apply, plus the entry's own `endpoint`
    (a path under the host) and `headers`."""
    from airflow.providers.http.notifications import HttpNotifier

    def send(alert: Alert) -> None:
        notifier = HttpNotifier(
            http_conn_id=str(options["conn_id"]),
            endpoint=options.get("endpoint"),
            json=json.loads(json.dumps(asdict(alert), default=str)),
            headers=dict(options.get("headers") or {}),
        )
        notifier.notify({})

    return send


BUILTIN_KINDS: dict[str, Callable[[Mapping[str, Any]], Sender]] = {
    "jsonl": _jsonl_sender,
    "smtp": _smtp_sender,
    "webhook": _webhook_sender,
}
_REQUIRED = {"jsonl": ("path",), "smtp": ("to",), "webhook": ("conn_id",)}


def sender_for(name: str, registry: Mapping[str, Any]) -> Sender:
    """The sender a notifier name stands for in `registry`; NotifierError saying what is wrong."""
    entry = registry.get(name)
    if not isinstance(entry, Mapping):
        known = ", ".join(sorted(registry)) or "none"
        raise NotifierError(
            f"notifier {name!r} is not in the Airflow Variable {REGISTRY_VARIABLE} (known: {known})"
        )
    kind = str(entry.get("kind", ""))
    if kind in BUILTIN_KINDS:
        missing = [key for key in _REQUIRED[kind] if key not in entry]
        if missing:
            raise NotifierError(f"notifier {name!r} (kind {kind}) needs {', '.join(missing)}")
        return BUILTIN_KINDS[kind](entry)
    plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if kind in plugins:
        factory = plugins[kind].load()
        return factory(dict(entry))  # type: ignore[no-any-return]
    kinds = ", ".join(sorted({*BUILTIN_KINDS, *plugins}))
    raise NotifierError(f"notifier {name!r}: unknown kind {kind!r} (kinds: {kinds})")


def load_registry() -> dict[str, Any]:
    """The deployment's notifier registry: the JSON of the Airflow Variable cdc_notifiers, or {}.

    Airflow 3.3's execution API refuses Variable reads to deadline callbacks (their token is not a
    task's), so there the Variable is read from the environment, `AIRFLOW_VAR_CDC_NOTIFIERS`:
    the way Airflow itself defines a Variable in the environment. Deployments that want deadline
    alerts define it there.
    """
    from airflow.sdk import Variable

    try:
        value = Variable.get(REGISTRY_VARIABLE, default=None)
    except PermissionError:  # AirflowSecretsBackendAccessDenied: a callback, not a task
        value = os.environ.get(ENVIRONMENT_VARIABLE)
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}  # none, or compose's AIRFLOW_VAR_CDC_NOTIFIERS with CDC_NOTIFIERS unset
    registry = json.loads(value) if isinstance(value, str) else value
    if not isinstance(registry, dict):
        raise NotifierError(f"the Airflow Variable {REGISTRY_VARIABLE} must be a JSON object")
    return registry


def send_alert(
    alert: Alert, names: Sequence[str], registry: Mapping[str, Any] | None = None
) -> list[str]:
    """Send `alert` to each named notifier; returns the names that failed (each one is logged)."""
    log.warning("CDC alert %s: %s", alert.subject(), alert.message)
    if not names:
        return []
    failed = []
    try:
        table = load_registry() if registry is None else registry
    except Exception:
        log.exception("cannot read the notifier registry (Variable %s)", REGISTRY_VARIABLE)
        return list(names)
    for name in names:
        try:
            sender_for(name, table)(alert)
        except Exception:
            log.exception("notifier %s failed for %s", name, alert.subject())
            failed.append(name)
    return failed


class CdcNotifier(BaseNotifier):
    """Airflow's notifier interface over the row's notifier names (task failure callbacks)."""

    def __init__(self, table: str, names: Sequence[str]) -> None:
        super().__init__()
        self.table = table
        self.names = list(names)

    def notify(self, context: Any) -> None:
        """Send a task_failed alert naming the task, its try and the exception."""
        ti = context.get("ti") or context.get("task_instance")
        dag_run = context.get("dag_run")
        error = context.get("exception")
        if getattr(error, "cdc_alert_sent", False):
            return
        alert = Alert(
            kind="task_failed",
            table=self.table,
            dag_id=str(getattr(ti, "dag_id", "") or getattr(dag_run, "dag_id", "")),
            run_id=str(getattr(ti, "run_id", "") or getattr(dag_run, "run_id", "")),
            task_id=getattr(ti, "task_id", None),
            message=f"{type(error).__name__}: {error}" if error else "the task failed",
            details={"try_number": getattr(ti, "try_number", None)},
        )
        send_alert(alert, self.names)


class CdcRunTimeoutNotifier(BaseNotifier):
    """DAG failure callback: announce a run stopped by dagrun_timeout.

    Airflow marks the unfinished tasks of a timed-out run skipped, not failed, so no task failure
    callback tells anyone; other run failures come with their task's own alert.
    """

    def __init__(self, table: str, names: Sequence[str], dagrun_timeout: str) -> None:
        super().__init__()
        self.table = table
        self.names = list(names)
        self.dagrun_timeout = dagrun_timeout

    def notify(self, context: Any) -> None:
        """Send a run_timed_out alert when the run failed for its timeout."""
        if context.get("reason") != "timed_out":
            return
        dag = context.get("dag")
        alert = Alert(
            kind="run_timed_out",
            table=self.table,
            dag_id=str(getattr(dag, "dag_id", f"cdc_{self.table}")),
            run_id=str(context.get("run_id", "")),
            message=f"table {self.table}: the run exceeded dagrun_timeout {self.dagrun_timeout}; "
            "Airflow stopped its unfinished tasks",
        )
        send_alert(alert, self.names)


def deadline_missed(
    context: Mapping[str, Any], table: str, notify: Sequence[str], freshness: str
) -> None:
    """Deadline alert callback (runs on the executor): the run did not succeed in time."""
    dag_run = context.get("dag_run") or {}
    deadline = context.get("deadline") or {}
    alert = Alert(
        kind="deadline_missed",
        table=table,
        dag_id=str(dag_run.get("dag_id", f"cdc_{table}")),
        run_id=str(dag_run.get("dag_run_id") or dag_run.get("run_id", "")),
        message=(
            f"table {table}: the run did not succeed within {freshness} of being queued "
            f"(deadline {deadline.get('deadline_time')}); its state is {dag_run.get('state')}"
        ),
        details={
            "deadline_time": str(deadline.get("deadline_time")),
            "data_interval_start": dag_run.get("data_interval_start"),
            "data_interval_end": dag_run.get("data_interval_end"),
            "queued_at": dag_run.get("queued_at"),
        },
    )
    send_alert(alert, notify)


@dataclass(frozen=True)
class QuarantineFinding:
    """A stage run's quarantined share of the rows it read, against the row's limit."""

    rows_read: int
    quarantined: int
    limit: float

    @property
    def fraction(self) -> float:
        """quarantined / rows_read (0 when nothing was read)."""
        return self.quarantined / self.rows_read if self.rows_read else 0.0

    @property
    def exceeded(self) -> bool:
        """True when the run quarantined more than `limit` of its rows."""
        return self.fraction > self.limit


def quarantine_finding(report: Mapping[str, Any] | None, limit: float) -> QuarantineFinding:
    """The finding of a stage report's counts (a report without counts read nothing)."""
    counts = StageCounts.of_payload((report or {}).get("counts"))
    return QuarantineFinding(count(counts.rows_read), count(counts.quarantined), limit)


def quarantine_reasons(quarantine_path: Location, version: int, limit: int = 5) -> list[str]:
    """The most frequent `_cdc_reason`s of the rows committed in quarantine version `version`.

    Reads only the reason column of the files that version added (this run's quarantined rows).
    """
    from collections import Counter

    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    def files(at: int) -> set[str]:
        return set(DeltaTable(str(quarantine_path), version=at).file_uris()) if at >= 0 else set()

    reasons: Counter[str] = Counter()
    for uri in sorted(files(version) - files(version - 1)):
        if uri.startswith("file://"):
            column = pq.read_table(uri.removeprefix("file://"), columns=[REASON]).column(0)
        else:  # object storage: the same file through the driver's store
            location = as_location(uri)
            with store_for(location).open_read(location) as handle:
                column = pq.read_table(handle, columns=[REASON]).column(0)
        reasons.update(str(value) for value in column.to_pylist())
    return [f"{count} x {reason}" for reason, count in reasons.most_common(limit)]
