"""What `cdc repair` sets aside, and the move: `{warehouse}/<table>/final` to the sibling
`final.damaged-20261129T093000Z` (`.replaced-` for a table that is not damaged, such as applied
or a final rebuilt with --force), never a deletion.

A local folder is renamed (one atomic call on the same file system). Object storage has no
rename: every object is copied server-side, the copy is checked against the listing (names and
sizes) before anything is deleted, and the log (`_delta_log/`) is deleted before the data files,
so a move cut short leaves the source either whole or without a log (then no table: a repair
run again rebuilds it; the data files left behind are orphans no reader sees and vacuum
removes), and the copy whole before any deletion.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from cdc_pipeline.errors import CdcError
from cdc_pipeline.paths import Location
from spark_jobs.repair.diagnosis import Opened
from spark_jobs.runtime.storage import Entry, Store, is_local, store_for

LOG_DIR = "_delta_log"


@dataclass(frozen=True)
class Move:
    """One table folder set aside: which, from where, to where."""

    folder: str  # final, history, applied
    source: Location
    target: Location

    def document(self) -> dict[str, str]:
        """The move for `--json`."""
        return {"table": self.folder, "from": str(self.source), "to": str(self.target)}


def aside_name(source: Location, stamp: datetime, *, damaged: bool) -> Location:
    """The sibling `source` is moved to: `<name>.damaged-<UTC stamp>` (or `.replaced-`)."""
    kind = "damaged" if damaged else "replaced"
    return source.parent / f"{source.name}.{kind}-{stamp:%Y%m%dT%H%M%SZ}"


def set_aside(move: Move) -> None:
    """Move the folder `move.source` to `move.target` (see the module's note on S3).

    Raises CdcError when the target exists already or the copy does not match its source
    (nothing is deleted then)."""
    store = store_for(move.source)
    if store.info(move.target) is not None:
        raise CdcError(f"{move.target} exists already: run the repair again in a second")
    if is_local(move.source):
        store.move(move.source, move.target)
        return
    files = list(store.walk(move.source))
    for entry in files:
        store.copy(entry.location, move.target / relative(entry, move.source))
    wanted = {relative(e, move.source): e.size for e in files}
    copied = {relative(e, move.target): e.size for e in store.walk(move.target)}
    if copied != wanted:
        raise CdcError(
            f"copying {move.source} to {move.target} gave {len(copied)} objects for "
            f"{len(wanted)} (a writer is still at work?): nothing was deleted; pause the table's "
            f"DAG, remove {move.target} and run the repair again"
        )
    remove_log_first(store, move.source, files)


def relative(entry: Entry, root: Location) -> str:
    """The entry's path below `root`, `/`-separated."""
    return str(entry.location)[len(str(root)) + 1 :]


def remove_log_first(store: Store, root: Location, files: list[Entry]) -> None:
    """Delete the listed files of the table at `root`: its log first, then its data."""
    in_log = [relative(e, root).startswith(f"{LOG_DIR}/") for e in files]
    log = [e for e, logged in zip(files, in_log, strict=True) if logged]
    data = [e for e, logged in zip(files, in_log, strict=True) if not logged]
    for entry in [*log, *data]:
        store.remove(entry.location)


def planned_moves(opened: Iterable[Opened], stamp: datetime, *, rebuild_final: bool) -> list[Move]:
    """The folders a repair sets aside, in order: final when it is rebuilt (damaged, missing or
    --force), history when it is damaged, and applied whenever it is there (so every staged
    change is pending again)."""
    moves = []
    for table in opened:
        there = table.version is not None or table.damage is not None
        wanted = {
            "final": rebuild_final,
            "history": table.damage is not None,
            "applied": True,
        }.get(table.folder, False)
        if there and wanted:
            target = aside_name(table.path, stamp, damaged=table.damage is not None)
            moves.append(Move(table.folder, table.path, target))
    return moves
