"""What each step counts: one small typed record per step, in the order its summary line and its
JSON (`--json`, the task's XCom) show them.

A field left None was not reported by this run (a no-op reports fewer); a `dict` field marked
`flat` contributes its own keys (a format's skipped lines by kind, an extract's operations). The
steps fill these; the CLI and the Airflow layer read them back from the JSON with `of_payload`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

_FLAT = {"flat": True}
C = TypeVar("C", bound="Counts")


@dataclass
class Counts:
    """Base of the per-step records."""

    def as_dict(self) -> dict[str, Any]:
        """The reported counts by name, in field order (what the summary line shows)."""
        shown: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is None:
                continue
            if spec.metadata.get("flat"):
                shown.update(value)
            else:
                shown[spec.name] = value
        return shown

    def with_reported(self: C, other: C) -> C:
        """This record with every field `other` reports (not None) taken from it."""
        taken = {f.name: getattr(other, f.name) for f in fields(other)}
        return replace(self, **{name: value for name, value in taken.items() if value is not None})

    @classmethod
    def of_payload(cls: type[C], counts: dict[str, Any] | None) -> C:
        """The record from a summary's JSON `counts` (keys it does not know are left out)."""
        counts = counts or {}
        known = {f.name for f in fields(cls) if not f.metadata.get("flat")}
        return cls(**{k: v for k, v in counts.items() if k in known})


def count(value: Any) -> int:
    """A reported count as an int (0 when not reported)."""
    return int(value or 0)


@dataclass
class CompositeCounts(Counts):
    """A composite command's counts, picked by name from its steps' (`cdc run`)."""

    picked: dict[str, Any] = field(default_factory=dict, metadata=_FLAT)


@dataclass
class NoopCounts(Counts):
    """An interval with nothing to do: no landing file, no staged batch."""

    noop: str | None = "true"
    files: int | None = 0
    # Files landed before the window, never staged (stage only; the alert fires on no-ops too).
    files_outside_window: int | None = None


@dataclass
class StageCounts(Counts):
    """`stage`: the files it found and the rows it staged or quarantined."""

    files: int | None = None
    new_files: int | None = None
    # A Kafka table: the offsets its ranges span, and those retention deleted unstaged (when
    # the row accepts the loss).
    messages: int | None = None
    messages_lost: int | None = None
    rows_read: int | None = None
    staged: int | None = None
    quarantined: int | None = None
    files_refused: int | None = None
    symlinks_refused: int | None = None
    unrecognised_entries: int | None = None
    files_deferred: int | None = None
    files_outside_window: int | None = None
    # An event format's skipped lines by kind (transaction_markers, tombstones_skipped, ...).
    skipped: dict[str, int] | None = field(default=None, metadata=_FLAT)
    undeclared_columns_ignored: int | None = None
    columns_added: int | None = None
    columns_widened: int | None = None
    # A snapshot extract's derived changes by operation.
    operations: dict[str, int] | None = field(default=None, metadata=_FLAT)
    staging_version: int | None = None
    quarantine_version: int | None = None


@dataclass
class OverwriteCounts(Counts):
    """`overwrite-final` (and an insert-only table's append): changes applied, partitions
    rewritten, the final version; with history, what it logged."""

    changes: int | None = None
    truncates_applied: int | None = None
    changes_with_unknown_values: int | None = None
    keys: int | None = None
    keys_looked_up: int | None = None
    partitions_rewritten: int | None = None
    rows_written: int | None = None
    schema_changes: int | None = None
    tombstones_added: int | None = None
    attempts: int | None = None
    files_applied: int | None = None
    final_version: int | None = None
    history_changes_logged: int | None = None
    history_buckets_rewritten: int | None = None
    history_rows_written: int | None = None
    history_version: int | None = None

    def rewrote(self, partitions: int, rows: int, final_version: int) -> None:
        """What the commit of final did (0 and 0 with final's version: nothing to commit)."""
        self.partitions_rewritten, self.rows_written = partitions, rows
        self.final_version = final_version

    def logged(self, changes: int, buckets: int, rows: int, history_version: int) -> None:
        """What history logged and rewrote, and its version."""
        self.history_changes_logged, self.history_buckets_rewritten = changes, buckets
        self.history_rows_written, self.history_version = rows, history_version


@dataclass
class ResetCounts(Counts):
    """`reset-staging`: staging's rows before and after (with history, the changes it logged)."""

    history_changes_logged: int | None = None
    rows_before: int | None = None
    rows_after: int | None = None
    staging_version: int | None = None

    def reset(self, rows_before: int, rows_after: int, staging_version: int) -> None:
        """Staging's rows before and after the reset, and its version (-1: no staging)."""
        self.rows_before, self.rows_after = rows_before, rows_after
        self.staging_version = staging_version


@dataclass
class OptimizeCounts(Counts):
    """`optimize`: final's files before and after, then `<table>_files=before->after` for each
    other table, and final's version."""

    final_files_before: int | None = None
    final_files_after: int | None = None
    partitions_optimized: int | None = None
    others: dict[str, str] = field(default_factory=dict, metadata=_FLAT)
    final_version: int | None = None


@dataclass
class VacuumCounts(Counts):
    """`vacuum`: the retention, and `<table>_files_deleted` for each table that exists."""

    retention_hours: float | None = None
    deleted: dict[str, int] = field(default_factory=dict, metadata=_FLAT)


@dataclass
class AsOfCounts(Counts):
    """`as-of`: rows of the table at the time asked, and where they went."""

    rows: int | None = None
    output: str | None = None
    output_version: int | None = None
    printed: int | None = None


@dataclass
class TableCheckCounts(Counts):
    """`check` of one table, on its ok line: keys in final, remembered deletes."""

    keys: int | None = None
    tombstones: int | None = None


@dataclass
class CheckCounts(Counts):
    """`check`: tables checked, tables in breach, breaches."""

    tables: int | None = None
    breached: int | None = None
    breaches: int | None = None
