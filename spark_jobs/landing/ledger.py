"""Landing files known to the ledger by content (size, mtime, sha256), not only by name: the
ledger's rows, hashing a file (and checking it can be read), and what a stage does with the
listed entries (new versions, same-content touches, refusals)."""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.errors import UsageError
from cdc_pipeline.paths import Location, TablePaths
from spark_jobs.landing.listing import Listing, hour_files_before
from spark_jobs.landing.versions import (
    EXTENSIONS,
    SYMLINK_REASON,
    LandingFile,
    Refusal,
    VersionNumbers,
    is_reserved_name,
    split_version,
    unaddressable_reason,
)
from spark_jobs.runtime.storage import store_for

HASH_CHUNK = 1 << 20

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

LEDGER_SCHEMA = pa.schema(
    [
        ("batch", pa.string()),
        ("file", pa.string()),
        ("rows_staged", pa.int64()),
        ("rows_quarantined", pa.int64()),
        ("staged_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
        # The content of the file version: a later listing with another size or mtime is hashed.
        ("size", pa.int64()),
        ("mtime_ns", pa.int64()),
        ("sha256", pa.string()),
        # Why the version was refused (its one quarantine row says the same); null when staged.
        ("refused", pa.string()),
        # The newest value of the first sequence column among its staged rows, when that is a
        # time: freshness by data (`cdc status`) without reading any row again.
        ("newest_change", pa.timestamp("us", tz="UTC")),
    ]
)


def _versions_by_name(
    ledger: dict[tuple[str, str], LedgerEntry],
) -> dict[tuple[str, str], list[LedgerEntry]]:
    """(batch, landed name) -> the ledger entries of its versions."""
    versions: dict[tuple[str, str], list[LedgerEntry]] = {}
    for entry in ledger.values():
        name, _ = split_version(entry.file)
        versions.setdefault((entry.batch, name), []).append(entry)
    return versions


def is_known(landing_file: LandingFile, versions: dict[tuple[str, str], list[LedgerEntry]]) -> bool:
    """The ledger's latest version of the file has the size and mtime the listing saw (no hash)."""
    latest = _latest(versions.get((landing_file.batch, landing_file.name), []))
    return (
        latest is not None
        and not latest.is_link
        and (latest.size, latest.mtime_ns) == (landing_file.size, landing_file.mtime_ns)
    )


def unknown_files(
    files: Sequence[LandingFile], ledger: dict[tuple[str, str], LedgerEntry]
) -> list[LandingFile]:
    """The listed files whose current size and mtime the ledger does not know: not staged yet
    (or changed since), by the listing alone, without hashing."""
    versions = _versions_by_name(ledger)
    return [f for f in files if not is_known(f, versions)]


def unknown_before(
    paths: TablePaths, before: datetime, file_format: str, ledger: Ledger
) -> list[LandingFile]:
    """The change files the ledger does not know (by size and mtime) in every hour folder that
    starts before `before`: landed outside the late-arrival window, reported, never staged.

    A folder whose own mtime is not after the latest ledger row of its hour is not opened: no
    entry was added to, renamed into or removed from it since a stage run listed it (a year of
    hourly folders is then one stat per folder). A file rewritten in place in such a folder
    changes no folder mtime and is not seen here; a rerun over its hour still stages it."""
    root = paths.landing
    store = store_for(root)
    found_root = store.info(root)
    if found_root is None or found_root.is_link or not found_root.is_dir:
        return []
    extensions = EXTENSIONS[file_format]
    listed = []
    for batch, relative_folder, files in hour_files_before(
        store, root, before, ledger.newest_staged_ns()
    ):
        listed += [
            LandingFile(
                batch,
                entry.location,
                f"{relative_folder}/{entry.name}",
                entry.size,
                entry.mtime_ns or 0,
            )
            for entry in files
            if entry.is_file()
            and not entry.name.startswith((".", "_"))
            and entry.name.lower().endswith(extensions)
            and not is_reserved_name(entry.name)
        ]
    if not listed:
        return []
    return unknown_files(listed, ledger.entries({f.batch for f in listed}))


class ChangingFileError(OSError):
    """The file changed while it was read: it is left for the next run."""


class _GzipCheck:
    """Decompresses a `.gz` file's bytes as they are hashed (output dropped): a file Spark could
    not read is refused alone, before any Spark job (one bad file failed its whole hour)."""

    def __init__(self, lines: _LongestLine | None = None) -> None:
        self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.lines = lines  # measures the decompressed text's lines

    def feed(self, chunk: bytes) -> None:
        try:
            while chunk:
                if self.inflate.eof:  # the next gzip member (concatenated: one valid file)
                    self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                text = self.inflate.decompress(chunk, 1 << 16)  # output bounded: no gzip bomb
                if self.lines is not None:
                    self.lines.feed(text)
                # After a member's end, the rest of the input is the next member's; otherwise
                # what the output bound held back.
                inflate = self.inflate
                chunk = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
        except zlib.error as error:
            raise OSError(f"not valid gzip data ({error})") from None

    def finish(self) -> None:
        if not self.inflate.eof:
            raise OSError("not valid gzip data (the file ends inside a compressed block)")


class _LongestLine:
    """The longest line of a text fed chunk by chunk, exact from one chunk's length on (a line
    inside one chunk is shorter than it): two byte searches per chunk."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0  # bytes since the last line end
        self.longest = 0

    def feed(self, chunk: bytes) -> None:
        first = chunk.find(b"\n")
        if first < 0:
            self.open += len(chunk)
        else:
            self.longest = max(self.longest, self.open + first)
            self.open = len(chunk) - chunk.rfind(b"\n") - 1
        self.longest = max(self.longest, self.open)
        if self.longest > self.limit:
            raise LineTooLongError(self.limit)


class LineTooLongError(OSError):
    """A text file with a line longer than CDC_MAX_LINE_BYTES: Spark holds a line in one piece
    of the driver's memory, and one such line would fail every run of its table."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"a line is longer than {MAX_LINE_ENV}={limit} bytes ({limit / 2**20:g} MiB), more "
            f"than one change row may be: one line that size can take the driver's memory and "
            f"fail every run of the table. Write one change per line; for longer rows raise "
            f"{MAX_LINE_ENV} with CDC_SPARK_DRIVER_MEMORY"
        )


MAX_LINE_ENV = "CDC_MAX_LINE_BYTES"

DEFAULT_MAX_LINE = 16 << 20


def max_line_bytes() -> int:
    """The longest line a CSV or JSON change file may hold (CDC_MAX_LINE_BYTES, at least 1 MiB:
    the exact length of shorter lines is not measured)."""
    text = os.environ.get(MAX_LINE_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_LINE
    if not text.isdigit() or int(text) < HASH_CHUNK:
        raise UsageError(
            f"{MAX_LINE_ENV}={text!r} must be a number of bytes of at least {HASH_CHUNK} (1 MiB)"
        )
    return int(text)


TEXT_EXTENSIONS = (*EXTENSIONS["csv"], *EXTENSIONS["json"])


def file_digest(path: Location) -> tuple[str, int, int]:
    """(sha256, size, mtime_ns) of a regular file, never through a link (O_NOFOLLOW).

    Raises OSError when it cannot be read, or when it changed while it was hashed; a CSV or JSON
    file with a line longer than `max_line_bytes` raises LineTooLongError (an OSError).
    """
    store = store_for(path)
    before = store.info(path)
    if before is None:
        raise FileNotFoundError(2, "No such file or directory")
    name = path.name.lower()
    limit = max_line_bytes()
    lines = _LongestLine(limit) if name.endswith(TEXT_EXTENSIONS) else None
    with store.open_read(path) as handle:
        digest = hashlib.sha256()
        gzipped = _GzipCheck(lines) if name.endswith(".gz") else None
        # A file no longer than the limit cannot hold a line over it: not searched.
        plain = lines if gzipped is None and before.size > limit else None
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            if gzipped is not None:
                gzipped.feed(chunk)
            elif plain is not None:
                plain.feed(chunk)
        if gzipped is not None:
            gzipped.finish()
    after = store.info(path)
    if after is None or (before.size, before.mtime_ns) != (after.size, after.mtime_ns):
        raise ChangingFileError(f"{path.name} changed while it was read")
    return digest.hexdigest(), after.size, after.mtime_ns or 0


def has_changed(landing_file: LandingFile) -> bool:
    """True when the file's size or mtime is no longer what its listing saw (or it is gone)."""
    info = store_for(landing_file.path).info(landing_file.path)
    if info is None:
        return True
    return (info.size, info.mtime_ns) != (landing_file.size, landing_file.mtime_ns)


@dataclass(frozen=True)
class LedgerEntry:
    """The latest ledger row of one file version."""

    batch: str
    file: str
    size: int | None
    mtime_ns: int | None
    sha256: str | None
    refused: str | None
    staged_at: datetime | None
    rows_staged: int = 0  # the most any ledger row of this version says were staged
    newest_change: datetime | None = None  # newest sequence time of its rows (a time column)

    @property
    def is_staged(self) -> bool:
        """Rows of this version are in staging (a same-content touch row records 0 again)."""
        return self.refused is None and self.rows_staged > 0

    @property
    def ident(self) -> tuple[str, str]:
        """(batch, arrival identity), as staging names the version's rows."""
        return (self.batch, self.file)

    @property
    def is_link(self) -> bool:
        """A refused link: no content was ever read."""
        return self.refused == SYMLINK_REASON


# The columns of a file version's latest row; older ledgers lack the content columns.
_ENTRY_COLUMNS = (
    "batch",
    "file",
    "size",
    "mtime_ns",
    "sha256",
    "refused",
    "staged_at",
    "rows_staged",
    "newest_change",
)
_ENTRY_SCHEMA = pa.schema([LEDGER_SCHEMA.field(name) for name in _ENTRY_COLUMNS])


@dataclass(frozen=True)
class Ledger:
    """The ledger's latest row per file version (batch, arrival identity), kept as Arrow columns.

    The ledger gains a row per file version and run, for ever: a year of `*/15` runs is 35,000
    rows, and turning each into Python objects took 20 us a row, several times a table-run (the
    no-op checks, stage, overwrite-final). Only the rows a run asks for become `LedgerEntry`s:
    those of the hours it lists (`entries`), those final has not applied
    (`overwrite.applied.pending_files`, an anti-join of the columns)."""

    latest: pa.Table  # _ENTRY_SCHEMA, one row per (batch, file)

    def __len__(self) -> int:
        return self.latest.num_rows

    def entries(self, batches: Iterable[str] | None = None) -> dict[tuple[str, str], LedgerEntry]:
        """(batch, arrival identity) -> latest row, of the given hour batches (None: all)."""
        table = self.latest
        if batches is not None:
            wanted = pa.array(sorted(set(batches)), pa.string())
            table = table.filter(pc.is_in(table["batch"], value_set=wanted))
        return {(e.batch, e.file): e for e in _as_entries(table)}

    def idents(self) -> set[tuple[str, str]]:
        """(batch, arrival identity) of every version (two string columns, no other object)."""
        columns = self.latest.select(["batch", "file"]).to_pydict()
        return set(zip(columns["batch"], columns["file"], strict=True))

    def unrefused_batches(self) -> set[str]:
        """The hour batches with a version not refused."""
        table = self.latest.filter(pc.is_null(self.latest["refused"]))
        return set(pc.unique(table["batch"]).to_pylist())

    def newest_staged_ns(self) -> dict[str, int]:
        """Per hour batch, the newest `staged_at` of its rows (epoch nanoseconds)."""
        rows = self.latest.filter(pc.is_valid(self.latest["staged_at"]))
        newest = rows.group_by("batch").aggregate([("staged_at", "max")])
        stamps = pc.cast(newest["staged_at_max"], pa.int64()).to_pylist()  # microseconds
        return {b: us * 1000 for b, us in zip(newest["batch"].to_pylist(), stamps, strict=True)}

    def staged(self, *, whole_extracts: bool = False) -> pa.Table:
        """Versions with rows in staging (`whole_extracts`: every version not refused, an empty
        extract too)."""
        mask = pc.is_null(self.latest["refused"])
        if not whole_extracts:
            mask = pc.and_(mask, pc.greater(self.latest["rows_staged"], 0))
        return self.latest.filter(mask)

    def newest_change(self, applied: pa.Table) -> datetime | None:
        """The newest change time among the versions `applied` (batch, file) holds."""
        done = self.latest.join(
            applied.select(["batch", "file"]), ["batch", "file"], join_type="left semi"
        )
        newest = pc.max(done["newest_change"]).as_py()
        return newest if isinstance(newest, datetime) else None


def _as_entries(table: pa.Table) -> list[LedgerEntry]:
    return [
        LedgerEntry(
            row["batch"],
            row["file"],
            row["size"],
            row["mtime_ns"],
            row["sha256"],
            row["refused"],
            row["staged_at"],
            int(row["rows_staged"] or 0),
            row["newest_change"],
        )
        for row in table.to_pylist()
    ]


def read_ledger(rows: pa.Table | None) -> Ledger:
    """The latest row per (batch, arrival identity), by `staged_at` (a later row of the same time
    wins), with the most rows any of its rows says were staged and the newest change any
    recorded; rows of older ledgers lack the content columns and read as unknown content."""
    if rows is None or rows.num_rows == 0:
        return Ledger(_ENTRY_SCHEMA.empty_table())
    columns = []
    for field_ in _ENTRY_SCHEMA:
        if field_.name in rows.column_names:
            columns.append(pc.cast(rows[field_.name], field_.type))
        else:
            columns.append(pa.nulls(rows.num_rows, field_.type))
    table = pa.table(columns, schema=_ENTRY_SCHEMA)
    table = table.set_column(
        _ENTRY_COLUMNS.index("rows_staged"),
        "rows_staged",
        pc.fill_null(table["rows_staged"], 0),
    )
    epoch = pa.scalar(_EPOCH, LEDGER_SCHEMA.field("staged_at").type)
    order = table.append_column("_staged", pc.fill_null(table["staged_at"], epoch))
    order = order.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    order = order.sort_by(
        [
            ("batch", "ascending"),
            ("file", "ascending"),
            ("_staged", "ascending"),
            ("_row", "ascending"),
        ]
    )
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=False)
    kept = [c for c in _ENTRY_COLUMNS[2:] if c not in ("rows_staged", "newest_change")]
    grouped = order.group_by(["batch", "file"], use_threads=False).aggregate(
        [(c, "last", keep_nulls) for c in kept] + [("rows_staged", "max"), ("newest_change", "max")]
    )
    named = {
        "batch": grouped["batch"],
        "file": grouped["file"],
        **{c: grouped[f"{c}_last"] for c in kept},
        "rows_staged": grouped["rows_staged_max"],
        "newest_change": grouped["newest_change_max"],
    }
    return Ledger(pa.table([named[c] for c in _ENTRY_COLUMNS], schema=_ENTRY_SCHEMA))


@dataclass
class FilePlan:
    """What a stage does with the listed entries."""

    pending: list[LandingFile] = field(default_factory=list)  # new versions to read
    refusals: list[Refusal] = field(default_factory=list)  # new: a quarantine and a ledger row
    links: int = 0  # links present this run (also those reported by an earlier run)
    touched: list[tuple[LandingFile, LedgerEntry]] = field(default_factory=list)  # same content
    changed_versions: list[LandingFile] = field(default_factory=list)  # re-staged versions
    deferred: list[LandingFile] = field(default_factory=list)  # changing now: the next run's
    numbers: VersionNumbers = field(default_factory=lambda: VersionNumbers())

    def refused_files(self) -> list[Refusal]:
        """Refusals of files (not links)."""
        return [r for r in self.refusals if r.source is not None]


def _unreadable(landing_file: LandingFile, error: OSError) -> Refusal:
    message = error.strerror or str(error)
    return Refusal(
        landing_file.batch,
        landing_file.file,
        landing_file.relative,
        f"unreadable file ({landing_file.size} bytes): {message}",
        landing_file,
    )


def _latest(known: Sequence[LedgerEntry]) -> LedgerEntry | None:
    return max(known, key=lambda e: split_version(e.file)[1]) if known else None


def _unaddressable(landing_file: LandingFile, latest: LedgerEntry | None, plan: FilePlan) -> bool:
    """A name Spark cannot address: refused alone (once), never hashed nor read."""
    reason = unaddressable_reason(landing_file.name)
    if reason is None:
        return False
    if latest is None or latest.is_link or latest.refused is None:  # else refused before
        plan.refusals.append(
            Refusal(
                landing_file.batch, landing_file.file, landing_file.relative, reason, landing_file
            )
        )
    return True


def plan_files(listing: Listing, ledger: dict[tuple[str, str], LedgerEntry]) -> FilePlan:
    """New file versions (hashed), same-content touches, and new link refusals.

    A file whose size and mtime equal its latest version's ledger row is unchanged without
    hashing; otherwise its hash decides: the same content is a touch (recorded so the next run
    need not hash it), other content is a new version. A ledger row without a hash (an older
    ledger) is unknown content: hashed and recorded, never re-staged. New versions of the hour
    are numbered after the ledger's, in listing order (links first, then files by name).
    """
    versions = _versions_by_name(ledger)
    plan = FilePlan()
    for batch, file in ledger:
        plan.numbers.holds(batch, [file])
    next_version = plan.numbers.next_name

    for link in listing.links:
        plan.links += 1
        latest = _latest(versions.get((link.batch, link.file), []))
        if latest is not None and latest.is_link:
            continue  # reported (quarantined) by an earlier run
        if "/" in link.file or latest is None:
            # A linked folder: its relative path is its identity; a new link: its name.
            plan.refusals.append(link)
        else:
            plan.refusals.append(replace(link, file=next_version(link.batch, link.file)))
    for landing_file in listing.files:
        latest = _latest(versions.get((landing_file.batch, landing_file.name), []))
        stat_seen = (landing_file.size, landing_file.mtime_ns)
        if (
            latest is not None
            and not latest.is_link
            and (latest.size, latest.mtime_ns) == stat_seen
        ):
            continue
        if _unaddressable(landing_file, latest, plan):
            continue
        try:
            sha256, size, mtime_ns = file_digest(landing_file.path)
        except ChangingFileError:
            plan.deferred.append(landing_file)
            continue
        except OSError as error:
            if latest is not None and not latest.is_link and latest.refused is not None:
                continue  # refused before and still unreadable
            arrival = next_version(landing_file.batch, landing_file.name) if latest else None
            plan.refusals.append(_unreadable(replace(landing_file, arrival=arrival), error))
            continue
        seen = replace(landing_file, size=size, mtime_ns=mtime_ns, sha256=sha256)
        same_content = latest is not None and latest.sha256 in (None, sha256)
        if latest is not None and not latest.is_link and same_content:
            arrival = latest.file if latest.file != seen.name else None
            plan.touched.append((replace(seen, arrival=arrival), latest))
            continue
        if latest is None:
            plan.pending.append(seen)
            continue
        seen = replace(seen, arrival=next_version(seen.batch, seen.name))
        plan.pending.append(seen)
        plan.changed_versions.append(seen)
    return plan


def ledger_row(
    landing_file: LandingFile | None,
    batch: str,
    file: str,
    *,
    staged: int,
    quarantined: int,
    refused: str | None,
    now: datetime,
    run_id: str,
    newest_change: datetime | None = None,
) -> dict[str, Any]:
    """One ledger row of a file version (or a refused link, without content)."""
    return {
        "batch": batch,
        "file": file,
        "rows_staged": staged,
        "rows_quarantined": quarantined,
        "staged_at": now,
        "run_id": run_id,
        "size": landing_file.size if landing_file else None,
        "mtime_ns": landing_file.mtime_ns if landing_file else None,
        "sha256": landing_file.sha256 if landing_file else None,
        "refused": refused,
        "newest_change": newest_change,
    }
