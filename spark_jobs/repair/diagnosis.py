"""What `cdc repair` finds before it changes anything: which of a table's Delta tables cannot be
read, whether the tables final is rebuilt from can be, and the one-line reason when a repair
must be refused. delta-rs and the logs only (file lists and their row counts): no Spark, no write.

Invariants: final, history and applied are the tables a repair rebuilds (REPAIRABLE_TABLES);
staging, tombstones and the ledger (and history_log) are what it rebuilds them from, so damage
to one of those refuses the repair, naming the manual step instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import REPAIRABLE_TABLES, TableDamagedError
from cdc_pipeline.paths import Location, TablePaths
from spark_jobs import delta
from spark_jobs.landing import read_ledger
from spark_jobs.overwrite.applied import pending_files

# What final (and history) is rebuilt from: read, never written, by a repair.
SOURCES = ("staging", "tombstones", "ledger", "history_log")

# Each source's damage: what it means for final, and the manual step (docs/operations.md,
# Damaged tables). Staging is never rebuilt from final: final is the derived table.
SOURCE_FIXES = {
    "staging": (
        "final is rebuilt from staging, never staging from final: restore staging's commit file "
        "from a backup; without one, rebuild staging from the landing zone (move staging, ledger "
        "and applied aside and run over the landed hours; it needs the landed files, or the "
        "Kafka topic, of every change not yet in final)"
    ),
    "tombstones": (
        "the remembered deletes keep a rebuilt final from bringing deleted keys back: restore "
        "tombstones' commit file from a backup"
    ),
    "ledger": (
        "the ledger says which staged changes there are to apply: restore its commit file from "
        "a backup; without one, move ledger and applied aside and run over the landed hours (the "
        "files are staged again), then repair final if it is still damaged"
    ),
    "history_log": "history is cut from its log: restore history_log's commit file from a backup",
}


@dataclass(frozen=True)
class Damage:
    """One Delta table whose log cannot be read: which, where, and delta-rs' reason."""

    folder: str  # final, history, applied, staging, ...
    path: Location
    where: str  # `version 3, _delta_log/00000000000000000003.json`
    cause: str

    def line(self) -> str:
        """`final (/w/t/final): version 3, _delta_log/...json is damaged (cause)`."""
        return f"{self.folder} ({self.path}): {self.where} is damaged ({self.cause})"

    def document(self) -> dict[str, str]:
        """The damage for `--json`."""
        return {
            "table": self.folder,
            "path": str(self.path),
            "where": self.where,
            "cause": self.cause,
        }


@dataclass(frozen=True)
class Opened:
    """One Delta table of the table's folder as the diagnosis found it."""

    folder: str
    path: Location
    version: int | None  # None: no table there (or a damaged one)
    damage: Damage | None = None


@dataclass(frozen=True)
class Diagnosis:
    """Every Delta table a repair reads or rebuilds, and what staging holds to rebuild from."""

    table: TableConfig
    opened: dict[str, Opened]
    staged_files: int = 0  # file versions the ledger says staged rows
    staged_rows: int = 0  # rows the ledger says were staged
    staging_rows: int = 0  # rows staging holds (its log's counts)
    remembered: int = 0  # rows tombstones hold (deletes and truncates)
    pending: int | None = None  # staged file versions not applied yet (None: applied unreadable)

    @property
    def damaged(self) -> list[Damage]:
        """The damaged tables a repair rebuilds (final, history, applied)."""
        return [
            o.damage for o in self.opened.values() if o.damage and o.folder in REPAIRABLE_TABLES
        ]

    @property
    def blocking(self) -> list[Damage]:
        """The damaged tables a repair would rebuild from (staging, tombstones, ledger, ...)."""
        return [o.damage for o in self.opened.values() if o.damage and o.folder in SOURCES]

    @property
    def final_missing(self) -> bool:
        """No final table, though staging holds changes (a repair cut short after its moves,
        or final moved away by hand): a repair rebuilds it."""
        final = self.opened["final"]
        return final.version is None and final.damage is None and self.staged_files > 0

    def versions(self) -> str:
        """`final@5, applied@4` for the tables that open."""
        opened = [o for o in self.opened.values() if o.version is not None]
        return ", ".join(f"{o.folder}@{o.version}" for o in opened) or "no table yet"


def open_one(folder: str, path: Location) -> Opened:
    """Open one table of the folder: its version, or its damage."""
    try:
        table = delta.open_table(path)
    except TableDamagedError as error:
        return Opened(folder, path, None, Damage(folder, path, error.where, error.cause))
    return Opened(folder, path, table.version() if table is not None else None)


def diagnose(table: TableConfig, paths: TablePaths) -> Diagnosis:
    """Open final, history (history: true) and applied, and what they are rebuilt from."""
    folders = ["final", "applied", "staging", "tombstones", "ledger"]
    if table.history:
        folders[1:1] = ["history"]
        folders.append("history_log")
    opened = {name: open_one(name, getattr(paths, name)) for name in folders}
    diagnosis = Diagnosis(table, opened)
    if diagnosis.blocking:
        return diagnosis  # nothing is counted from a table that cannot be read
    ledger = read_ledger(delta.arrow_table(paths.ledger))
    staged = ledger.staged()
    pending = None
    if opened["applied"].damage is None:
        extracts = table.change_format == "snapshot"
        pending = len(pending_files(paths, whole_extracts=extracts, ledger=ledger).files)
    return Diagnosis(
        table,
        opened,
        staged_files=staged.num_rows,
        staged_rows=pc.sum(staged["rows_staged"]).as_py() or 0,
        staging_rows=delta.load_snapshot(paths.staging).num_records,
        remembered=delta.load_snapshot(paths.tombstones).num_records,
        pending=pending,
    )


def refusal(diagnosis: Diagnosis, *, rebuild_final: bool) -> str | None:
    """Why the repair must not run, as one line saying what is wrong and the fix (the caller's
    prefix, `repair <table>: `, names the table); None when it may. `rebuild_final`: final is
    to be rebuilt from staging (damaged, missing or --force), not only history or applied."""
    if diagnosis.blocking:
        damage = diagnosis.blocking[0]  # staging first: SOURCES' order
        return (
            f"{damage.folder} is damaged ({damage.where}: {damage.cause}); "
            f"{SOURCE_FIXES[damage.folder]} (docs/operations.md, Damaged tables)"
        )
    if not rebuild_final:
        return None
    if diagnosis.opened["staging"].version is None:
        return (
            "staging holds no change to rebuild final from: restore final's "
            "commit file from a backup (docs/operations.md, Damaged tables)"
        )
    if diagnosis.table.insert_only and diagnosis.staging_rows < diagnosis.staged_rows:
        # reset-staging keeps only the events final has not applied yet: the others are in
        # final alone, so a final rebuilt from staging would lose them.
        return (
            f"staging holds {diagnosis.staging_rows} of the "
            f"{diagnosis.staged_rows} events the ledger says were staged (an insert-only "
            "table's reset-staging keeps only the events final has not applied), so a final "
            "rebuilt from it would lose events: restore final's commit file from a backup "
            "(docs/operations.md, Damaged tables)"
        )
    return None
