"""A landed change file and its versions: the extensions each format lands, a file version
(`LandingFile`) and a refused entry (`Refusal`), and the arrival identities of re-staged versions.

A file that changes after it was staged is a new version with its own arrival identity,
`~0001~name`, `~0002~name`, ...: the number counts the hour's re-staged versions, so a version
ranks after every file of its hour staged before it (the earlier versions of the file included),
whatever its name."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from cdc_pipeline.errors import InputError
from cdc_pipeline.paths import Location

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

SYMLINK_REASON = (
    "symbolic link refused: landing links are never followed; put the file itself in the folder"
)


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
