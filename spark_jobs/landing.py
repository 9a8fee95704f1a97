"""Landing is a boundary: an interval's change files, listed without following links, probed on the
driver, and known to the ledger by content (size, mtime, sha256), not only by name.

A link (file or folder) under a table's landing folder is never followed nor opened: it is refused
and reported. Folders and files the layout does not name (bad dt=/hr= names, files outside hour
folders, other extensions) are reported once per run; only the table folder's top level, the
interval's dt= folders and its hour folders are looked at. A file that changes after it was staged
is a new version with its own arrival identity, `~0001~name`, `~0002~name`, ...: the number
counts the hour's re-staged versions, so a version ranks after every file of its hour staged
before it (the earlier versions of the file included), whatever its name.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_pipeline.errors import InputError, UsageError
from cdc_pipeline.intervals import HourBatch, Interval, batch_id
from cdc_pipeline.paths import Location, TablePaths
from cdc_pipeline.schema import common_type
from spark_jobs.runtime.storage import Entry, Store, is_local, store_for

# Text files may be gzip-compressed (Kafka Connect's S3 sink writes `.json.gz`): Spark reads
# them by their extension, the ledger hashes their bytes as they landed.
EXTENSIONS = {
    "parquet": (".parquet",),
    "csv": (".csv", ".csv.gz"),
    "json": (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz"),
}
# `~0001~name`: '~' sorts after every other printable ASCII character, so a re-staged version
# sorts after every landed name that starts with one (names starting with a non-ASCII letter sort
# after it; landed names of the version shape are reserved: reported, never read). The number
# counts the hour's re-staged versions in the order they were staged, so later sorts later.
VERSION_PREFIX = "~"
VERSION_DIGITS = 4
MAX_VERSIONS_PER_HOUR = 10**VERSION_DIGITS - 1
_VERSIONED = re.compile(r"^~(\d{4})~(.+)$")
# Ledgers written before the hour-wide numbering name versions `name~v002` (kept as they are).
_OLD_VERSIONED = re.compile(r"^(.*)~v(\d{3,})$")
_DAY = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
_HOUR = re.compile(r"^hr=([01]\d|2[0-3])$")
SYMLINK_REASON = (
    "symbolic link refused: landing links are never followed; put the file itself in the folder"
)
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


# Hadoop reads a path with these characters as a glob pattern (a[1].json would match a1.json):
# each is escaped with a backslash before Spark gets the path, so a name is read as exactly that
# file (Hadoop's GlobPattern treats `\\x` as the literal x).
_GLOB_CHARACTERS = set("\\[]{}*?")


def spark_path(path: Location) -> str:
    """The path to hand to Spark's readers: glob characters escaped, so it names one file."""
    return "".join(f"\\{c}" if c in _GLOB_CHARACTERS else c for c in str(path))


def unaddressable_reason(name: str) -> str | None:
    """Why Spark/Hadoop cannot address a file of this name (None: it can).

    A `:` makes Hadoop's Path read the name as a URI with a scheme, a backslash is Hadoop's glob
    escape: such a file is refused alone (quarantined with this reason) and the rest of its
    hour is staged."""
    for character, what in ((":", "a colon"), ("\\", "a backslash")):
        if character in name:
            return (
                f"file name {name!r} has {what}, which Spark and Hadoop cannot read as a file "
                "name: rename the file (it is not staged)"
            )
    return None


def versioned_name(name: str, sequence: int) -> str:
    """The arrival identity (`_cdc_file`) of the hour's `sequence`-th re-staged file version."""
    if not 1 <= sequence <= MAX_VERSIONS_PER_HOUR:
        raise InputError(
            f"{name}: more than {MAX_VERSIONS_PER_HOUR} changed file versions in one hour folder; "
            "land new content under new file names"
        )
    return f"{VERSION_PREFIX}{sequence:0{VERSION_DIGITS}d}~{name}"


def split_version(file: str) -> tuple[str, tuple[int, int]]:
    """(landed name, rank) of an arrival identity: the landed name ranks (0, 0), an old ledger's
    `name~v002` (1, 2), a re-staged version `~0003~name` (2, 3); a later version ranks higher."""
    match = _VERSIONED.match(file)
    if match:
        return match.group(2), (2, int(match.group(1)))
    old = _OLD_VERSIONED.match(file)
    if old:
        return old.group(1), (1, int(old.group(2)))
    return file, (0, 0)


def is_reserved_name(name: str) -> bool:
    """A landed name of a re-staged version's shape (`~0001~a.json`): never read as a change file."""
    return _VERSIONED.match(name) is not None


@dataclass(frozen=True)
class LandingFile:
    """One version of a landed change file of one hour folder, with what its listing saw."""

    batch: str
    path: Location
    relative: str  # path from the table's landing folder: dt=.../hr=.../name
    size: int
    mtime_ns: int
    arrival: str | None = None  # a re-staged version's arrival identity; None: the name
    sha256: str | None = None

    @property
    def name(self) -> str:
        """File name within its hour folder."""
        return self.path.name

    @property
    def file(self) -> str:
        """Arrival identity, the `_cdc_file` of its rows: the name, `~0001~name` for a version
        re-staged after the file changed."""
        return self.arrival or self.name

    @property
    def is_new_version(self) -> bool:
        """A version staged after an earlier one of the same file."""
        return self.arrival is not None

    @property
    def ident(self) -> tuple[str, str]:
        """(batch, arrival identity): how staging, quarantine and the ledger name a file version."""
        return (self.batch, self.file)


@dataclass(frozen=True)
class Refusal:
    """A landing entry that is not staged: one quarantine row (null data) and one ledger row."""

    batch: str
    file: str  # `_cdc_file`: the file's arrival identity, or the folder's relative path
    relative: str  # `_cdc_raw`: the path from the table's landing folder
    reason: str  # `_cdc_reason`: one sentence
    source: LandingFile | None = None  # the file version refused (None for a link)


@dataclass
class Listing:
    """What the interval's part of a table's landing holds."""

    files: list[LandingFile] = field(default_factory=list)  # change files, in arrival order
    links: list[Refusal] = field(default_factory=list)  # links on the interval's paths
    unrecognised: list[str] = field(default_factory=list)  # entries the layout does not name


def _scan(store: Store, folder: Location) -> list[Entry]:
    # Hidden and `_` names (`.crc`, `_SUCCESS`, editors' temp files) are skipped, as Spark does.
    return [e for e in store.list_dir(folder) if not e.name.startswith((".", "_"))]


def _day(name: str) -> date | None:
    match = _DAY.match(name)
    if not match:
        return None
    try:
        return date.fromisoformat(match.group(1))
    except ValueError:
        return None


def list_landing(paths: TablePaths, interval: Interval, file_format: str) -> Listing:
    """The interval's change files, refused links and unrecognised entries; nothing is followed.

    Raises InputError when the table's landing folder itself is a link.
    """
    root = paths.landing
    listing = Listing()
    store = store_for(root)
    found = store.info(root)
    if found is not None and found.is_link:
        raise InputError(
            f"table {paths.name}: the landing folder {root} is a symbolic link; landing links are "
            "never followed: make it a real folder"
        )
    if found is None or not found.is_dir:
        return listing
    hours = {h.batch_id: h for h in interval.hours()}
    days: dict[date, list[str]] = {}
    for batch in sorted(hours):
        days.setdefault(hours[batch].start.date(), []).append(batch)
    day_folders = _day_folders(store, root, days, listing)
    hour_folders = _hour_folders(store, day_folders, hours, listing)
    _list_files(store, hour_folders, file_format, listing)
    return listing


def _day_folders(
    store: Store, root: Location, days: dict[date, list[str]], listing: Listing
) -> list[Entry]:
    """The interval's dt= folders; links (reported under the day's hour 00) and unrecognised
    entries go to the listing."""
    day_folders = []
    for entry in _scan(store, root):
        day = _day(entry.name)
        if entry.is_link:
            if day in days:
                # The day's hour 00 holds the report (quarantine is by hour), whatever the interval.
                batch = batch_id(day.isoformat(), "00")
                listing.links.append(Refusal(batch, entry.name, entry.name, SYMLINK_REASON))
            elif day is None:
                listing.unrecognised.append(f"{entry.name} (symbolic link)")
        elif day is None or not entry.is_dir:
            suffix = "/" if entry.is_dir else ""
            listing.unrecognised.append(entry.name + suffix)
        elif day in days:
            day_folders.append(entry)
    return day_folders


def _hour_folders(
    store: Store, day_folders: list[Entry], hours: dict[str, HourBatch], listing: Listing
) -> list[tuple[str, str, Location]]:
    """(batch, relative folder, folder) of the interval's hr= folders in the day folders; links
    and unrecognised entries go to the listing."""
    hour_folders = []
    for day_entry in day_folders:
        for entry in _scan(store, day_entry.location):
            relative = f"{day_entry.name}/{entry.name}"
            hour = _HOUR.match(entry.name)
            if hour is None or not (entry.is_dir or entry.is_link):
                suffix = "/" if entry.is_dir else ""
                listing.unrecognised.append(relative + suffix)
                continue
            batch = batch_id(day_entry.name[3:], hour.group(1))
            if batch not in hours:
                continue  # another interval's hour
            elif entry.is_link:
                listing.links.append(Refusal(batch, relative, relative, SYMLINK_REASON))
            else:
                hour_folders.append((batch, relative, entry.location))
    return hour_folders


def _list_files(
    store: Store, hour_folders: list[tuple[str, str, Location]], file_format: str, listing: Listing
) -> None:
    """The change files of the hour folders into the listing; links and other entries refused."""
    extensions = EXTENSIONS[file_format]
    for batch, folder_relative, folder in hour_folders:
        for entry in _scan(store, folder):
            relative = f"{folder_relative}/{entry.name}"
            if entry.is_link:
                listing.links.append(Refusal(batch, entry.name, relative, SYMLINK_REASON))
                continue
            if (
                not entry.is_file()
                or not entry.name.lower().endswith(extensions)
                or is_reserved_name(entry.name)
            ):
                suffix = "/" if entry.is_dir else ""
                listing.unrecognised.append(relative + suffix)
                continue
            listing.files.append(
                LandingFile(batch, entry.location, relative, entry.size, entry.mtime_ns or 0)
            )


def listing_interval(
    interval: Interval, window: timedelta, whole_extracts: bool = False
) -> Interval:
    """The hours a stage run over `interval` lists: every hour folder that starts in
    [end - window, end), and the interval's own hours when it is longer than the window.
    A full-extract table (`whole_extracts`) reads only its interval's own hours."""
    if whole_extracts:
        return interval
    return Interval(min(interval.start, interval.end - window), interval.end)


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
    paths: TablePaths,
    before: datetime,
    file_format: str,
    ledger: dict[tuple[str, str], LedgerEntry],
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
    seen: dict[str, int] = {}
    for known in ledger.values():
        if known.staged_at is not None:
            stamp = int(known.staged_at.timestamp() * 1e9)
            seen[known.batch] = max(seen.get(known.batch, 0), stamp)
    versions = _versions_by_name(ledger)
    extensions = EXTENSIONS[file_format]
    found = []
    for batch, relative_folder, files in _hour_files_before(store, root, before, seen):
        for entry in files:
            if (
                not entry.is_file()
                or entry.name.startswith((".", "_"))
                or not entry.name.lower().endswith(extensions)
                or is_reserved_name(entry.name)
            ):
                continue
            listed = LandingFile(
                batch,
                entry.location,
                f"{relative_folder}/{entry.name}",
                entry.size,
                entry.mtime_ns or 0,
            )
            if not is_known(listed, versions):
                found.append(listed)
    return found


def _hour_of(day_name: str, hour_name: str, before: datetime) -> str | None:
    """The batch of a dt=/hr= folder pair that starts before `before` (None: not such a folder)."""
    day = _day(day_name)
    hour = _HOUR.match(hour_name)
    if day is None or hour is None:
        return None
    start = datetime(day.year, day.month, day.day, int(hour.group(1)), tzinfo=UTC)
    return batch_id(day_name[3:], hour.group(1)) if start < before else None


def _hour_files_before(
    store: Store, root: Location, before: datetime, seen: dict[str, int]
) -> Iterable[tuple[str, str, list[Entry]]]:
    """(batch, relative folder, entries) of every hour folder that starts before `before`.

    On a local file system a folder whose mtime is not after `seen[batch]` is not opened; object
    storage has no folder times, so the table's landing is listed once, recursively (one
    paginated listing instead of one request per hour folder)."""
    if not is_local(root):
        grouped: dict[tuple[str, str], list[Entry]] = {}
        for entry in store.walk(root):
            parts = str(entry.location)[len(str(root)) + 1 :].split("/")
            if len(parts) == 3:
                grouped.setdefault((parts[0], parts[1]), []).append(entry)
        for (day_name, hour_name), entries in sorted(grouped.items()):
            batch = _hour_of(day_name, hour_name, before)
            if batch is not None:
                yield batch, f"{day_name}/{hour_name}", sorted(entries, key=lambda e: e.name)
        return
    for day_entry in _scan(store, root):
        day = _day(day_entry.name)
        if day is None or day > before.date() or not day_entry.is_dir:
            continue
        for hour_entry in _scan(store, day_entry.location):
            batch = _hour_of(day_entry.name, hour_entry.name, before)
            if batch is None or not hour_entry.is_dir:
                continue
            if (hour_entry.mtime_ns or 0) <= seen.get(batch, -1):
                continue
            relative_folder = f"{day_entry.name}/{hour_entry.name}"
            yield batch, relative_folder, store.list_dir(hour_entry.location)


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


def read_ledger(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], LedgerEntry]:
    """(batch, arrival identity) -> its latest ledger row; rows of older ledgers lack the content
    columns and read as unknown content."""
    latest: dict[tuple[str, str], LedgerEntry] = {}
    for row in rows:
        entry = LedgerEntry(
            row["batch"],
            row["file"],
            row.get("size"),
            row.get("mtime_ns"),
            row.get("sha256"),
            row.get("refused"),
            row.get("staged_at"),
            int(row.get("rows_staged") or 0),
            row.get("newest_change"),
        )
        key = (entry.batch, entry.file)
        known = latest.get(key)
        staged = max(entry.rows_staged, known.rows_staged if known else 0)
        newest = max(
            (t for t in (entry.newest_change, known.newest_change if known else None) if t),
            default=None,
        )
        if known is None or (entry.staged_at or _EPOCH) >= (known.staged_at or _EPOCH):
            latest[key] = replace(entry, rows_staged=staged, newest_change=newest)
        else:
            latest[key] = replace(known, rows_staged=staged, newest_change=newest)
    return latest


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


def latest_sequence(files: Iterable[str]) -> int:
    """The highest re-staged version number among arrival identities (0 when there is none)."""
    ranks = [split_version(f)[1] for f in files]
    return max([n for kind, n in ranks if kind == 2], default=0)


class VersionNumbers:
    """The one place re-staged file versions get their numbers: per hour folder (batch), each
    new version takes the next number after every one the ledger (or a crashed run's rows)
    already holds, so an arrival identity is never given twice."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def holds(self, batch: str, files: Iterable[str]) -> None:
        """`files` (arrival identities of `batch`) are taken: new numbers come after theirs."""
        self._last[batch] = max(self._last.get(batch, 0), latest_sequence(files))

    def next_name(self, batch: str, name: str) -> str:
        """The arrival identity of `name`'s next version in `batch`."""
        self._last[batch] = self._last.get(batch, 0) + 1
        return versioned_name(name, self._last[batch])


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


# Parquet footers: driver-side metadata reads (no row data), grouped by schema.

_NUMERIC = {"tinyint", "smallint", "int", "bigint", "float", "double"}
# The mark of a timestamp column stored in nanoseconds (`timestamp(ns)`, `timestamp_ntz(ns)`).
NANOS = "(ns)"
_TEMPORAL = {"date", "timestamp", "timestamp_ntz"}


def spark_type_of(arrow_type: pa.DataType) -> str:
    """The Spark SQL type name Spark gives a Parquet column of `arrow_type` (close enough to compare
    files: integers, floats, decimals, text, booleans, dates and timestamps, nested types)."""
    if pa.types.is_dictionary(arrow_type):
        return spark_type_of(arrow_type.value_type)
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "ns":
        # pandas' default: Spark reads it only as its count (staging.readers makes it text).
        return spark_type_of(pa.timestamp("us", arrow_type.tz)) + NANOS
    if pa.types.is_unsigned_integer(arrow_type):
        # Spark widens unsigned Parquet integers to the next signed type.
        return {8: "smallint", 16: "int", 32: "bigint"}.get(arrow_type.bit_width, "decimal(20,0)")
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        return str(from_arrow_type(arrow_type).simpleString())
    except Exception:  # an Arrow type Spark's converter does not know: compare it by name
        return str(arrow_type)


def _family(spark_type: str) -> str:
    if spark_type in _NUMERIC or spark_type.startswith("decimal"):
        return "number"
    if spark_type.removesuffix(NANOS) in _TEMPORAL:
        return "time"
    if spark_type.startswith(("struct", "array", "map")):
        return "nested"
    return spark_type  # string, boolean, binary, ...


def fits_declared(found: str, declared: str) -> bool:
    """Whether a Parquet column of type `found` can be read as the declared type (row by row)."""
    if _family(found) == "nested":
        return declared == found
    if found == "string" or declared == "string":
        return True  # text is parsed (or kept) row by row; a bad value is a quarantined row
    return _family(found) == _family(declared)


def probe_parquet(landing_file: LandingFile) -> dict[str, str]:
    """Column -> Spark type from the file's footer (metadata only; never through a link).

    Raises OSError or pyarrow's ArrowException when the footer cannot be read.
    """
    with store_for(landing_file.path).open_read(landing_file.path) as handle:
        footer = pq.ParquetFile(handle)
        schema, metadata = footer.schema_arrow, footer.metadata
    codecs = {
        metadata.row_group(g).column(c).compression
        for g in range(metadata.num_row_groups)
        for c in range(metadata.num_columns)
    }
    unreadable = sorted(codecs & SPARK_MISSING_CODECS)
    if unreadable:
        raise UnsupportedParquetError(
            f"compressed with {', '.join(unreadable)}, a codec Spark has no reader for; write it "
            "with snappy, zstd or gzip (pyarrow: write_table(..., compression='zstd'))"
        )
    return {f.name: spark_type_of(f.type) for f in schema}


# Parquet codecs pyarrow writes and Spark's Parquet reader cannot decompress (no codec class).
SPARK_MISSING_CODECS = {"BROTLI"}


class UnsupportedParquetError(ValueError):
    """A Parquet file whose footer reads but whose data Spark cannot read (its codec)."""


@dataclass
class ParquetPlan:
    """Parquet files grouped by footer schema, the run's column types, and refused files."""

    groups: list[list[LandingFile]] = field(default_factory=list)
    column_types: dict[str, str] = field(default_factory=dict)  # the type each column is read as
    nanos: set[str] = field(default_factory=set)  # timestamp columns in nanoseconds in a file
    refusals: list[Refusal] = field(default_factory=list)


def _refusal(landing_file: LandingFile, reason: str) -> Refusal:
    return Refusal(
        landing_file.batch, landing_file.file, landing_file.relative, reason, landing_file
    )


def plan_parquet(
    files: Sequence[LandingFile], declared: dict[str, str] | None, flag_source: str
) -> ParquetPlan:
    """Probe every footer; refuse unreadable files and files whose types contradict the declared
    columns (or, without declared columns, the type most of the run's files give a column; ties
    go to the earlier file); group the others by schema and pick each column's read type."""
    plan = ParquetPlan()
    schemas: list[tuple[LandingFile, dict[str, str]]] = []
    for landing_file in files:
        try:
            schemas.append((landing_file, probe_parquet(landing_file)))
        except (OSError, pa.ArrowException, UnsupportedParquetError) as error:
            message = (str(error).strip().splitlines() or [type(error).__name__])[0]
            plan.refusals.append(
                _refusal(
                    landing_file,
                    f"unreadable Parquet file ({landing_file.size} bytes): {message}",
                )
            )
    reference: dict[str, str] = {}
    if declared is not None:
        reference = {**declared, flag_source: "string"}
    else:
        seen: dict[str, list[str]] = {}
        for _, schema in schemas:
            for column, spark_type in schema.items():
                seen.setdefault(column, []).append(spark_type)
        for column, kinds in seen.items():
            # The type most files agree with (widening counts as agreeing); max keeps the first
            # of equal counts: the type of the earliest file.
            reference[column] = max(
                kinds, key=lambda t: sum(common_type(t, other) is not None for other in kinds)
            )
    accepted: list[tuple[LandingFile, dict[str, str]]] = []
    for landing_file, schema in schemas:
        problems = []
        for column, spark_type in schema.items():
            expected = reference.get(column)
            if expected is None or expected == spark_type:
                continue
            fits = (
                fits_declared(spark_type, expected)
                if declared is not None
                else common_type(spark_type, expected) is not None
            )
            if not fits:
                source = "the config declares" if declared is not None else "other files give"
                problems.append(f"{column} is {spark_type} in this file but {source} {expected}")
        if problems:
            plan.refusals.append(
                _refusal(landing_file, "Parquet schema refused: " + "; ".join(problems))
            )
        else:
            accepted.append((landing_file, schema))
    groups: dict[tuple[tuple[str, str], ...], list[LandingFile]] = {}
    found: dict[str, set[str]] = {}
    for landing_file, schema in accepted:
        groups.setdefault(tuple(sorted(schema.items())), []).append(landing_file)
        for column, spark_type in schema.items():
            found.setdefault(column, set()).add(spark_type)
    plan.groups = list(groups.values())
    plan.column_types = _read_types(found, declared is not None)
    plan.nanos = {c for c, types in found.items() if any(t.endswith(NANOS) for t in types)}
    return plan


def _read_types(found: dict[str, set[str]], declared: bool) -> dict[str, str]:
    """The type each column is read as, from the types the accepted files give it."""
    column_types = {}
    for column, types in found.items():
        ordered = sorted(types)
        if len(ordered) == 1:
            column_types[column] = ordered[0]
        elif declared:
            column_types[column] = "string"  # read as text, typed row by row as declared
        else:
            merged: str | None = ordered[0]
            for other in ordered[1:]:
                merged = common_type(merged, other) if merged else None
            column_types[column] = merged or "string"
    return column_types
