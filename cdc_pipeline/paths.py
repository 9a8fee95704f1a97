"""Where things live: the repository, the config file, a table's landing files and Delta tables."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cdc_pipeline.errors import UsageError

JARS_ENV = "CDC_SPARK_JARS"


def source_checkout() -> Path | None:
    """The source checkout the packages run from (the folder holding pyproject.toml beside
    them: `make install`'s editable install), or None when installed from a wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def project_root() -> Path:
    """Where config/, landing/ and warehouse/ are by default: the source checkout when running
    from one, else the working directory (an installed package reads nothing beside itself)."""
    return source_checkout() or Path.cwd()


def default_config_path() -> Path:
    """`CDC_CONFIG`, else config/tables.yaml under the project root."""
    env = os.environ.get("CDC_CONFIG")
    return Path(env) if env else project_root() / "config" / "tables.yaml"


def spark_jars_dir() -> Path | None:
    """The folder of extra jars every Spark session loads (Delta Lake's reader, S3A):
    `CDC_SPARK_JARS`, else the checkout's jars/ (`make install` fills it), else None: none."""
    env = os.environ.get(JARS_ENV)
    if env:
        return Path(env).resolve()
    checkout = source_checkout()
    return checkout / "jars" if checkout is not None else None


def spark_jars() -> list[Path]:
    """The jars of `spark_jars_dir()`, by name (none when it is unset or missing)."""
    folder = spark_jars_dir()
    return sorted(folder.glob("*.jar")) if folder is not None else []


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is under it (as users typed it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
# Object storage the steps read and write: S3 and S3-compatible servers (Spark through S3A,
# delta-rs and the driver through the AWS SDKs). `s3a://` is accepted as the same place.
OBJECT_SCHEMES = ("s3", "s3a")


class ObjectPath:
    """A folder or file in object storage, `s3://bucket/key`: what a local `Path` is for a folder
    on disk, with the few operations the steps use (`/`, `name`, `parent`, `str`). File system
    calls go through spark_jobs/runtime/storage.py; `os.fspath` refuses it, so no `os`/`pathlib`
    call can take it for a local folder named `s3:`."""

    __slots__ = ("bucket", "key")

    def __init__(self, bucket: str, key: str = "") -> None:
        self.bucket = bucket
        self.key = "/".join(part for part in key.split("/") if part)

    @classmethod
    def parse(cls, uri: str) -> ObjectPath:
        """`s3://bucket/prefix` (or `s3a://`)."""
        match = _URI.match(uri)
        if not match or match.group(1).lower() not in OBJECT_SCHEMES:
            raise ValueError(f"{uri}: not an s3:// location")
        bucket, _, key = match.group(2).partition("/")
        if not bucket:
            raise ValueError(f"{uri}: no bucket")
        return cls(bucket, key)

    def __truediv__(self, part: str) -> ObjectPath:
        return ObjectPath(self.bucket, f"{self.key}/{part}")

    @property
    def name(self) -> str:
        """The last part of the key."""
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        """The folder holding it."""
        return ObjectPath(self.bucket, self.key.rpartition("/")[0])

    def relative_to(self, other: ObjectPath) -> str:
        """The key below `other`'s, `/`-separated."""
        prefix = f"{other.key}/" if other.key else ""
        if other.bucket != self.bucket or not self.key.startswith(prefix):
            raise ValueError(f"{self} is not under {other}")
        return self.key[len(prefix) :]

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.bucket, self.key) == (
            other.bucket,
            other.key,
        )

    def __hash__(self) -> int:
        return hash((self.bucket, self.key))

    def __fspath__(self) -> str:
        raise TypeError(
            f"{self} is object storage, not a local path (use spark_jobs/runtime/storage.py)"
        )


# A table's folders: on the local (or a mounted) file system, or in object storage.
Location = Path | ObjectPath


def location_uri(location: Location) -> str:
    """A folder as a URI: `s3://bucket/key`, or `file:///absolute/path` for a local one."""
    return str(location) if isinstance(location, ObjectPath) else location.resolve().as_uri()


def as_location(text: str | Path) -> Location:
    """`s3://bucket/prefix` as an ObjectPath; anything else a resolved local Path.

    Raises UsageError for another URI scheme (a Path of `gs://b/x` would be the local folder
    `gs:/b/x`, created without a word)."""
    if isinstance(text, Path):
        return text.resolve()
    match = _URI.match(text)
    if match:
        if match.group(1).lower() not in OBJECT_SCHEMES:
            raise UsageError(
                f"{text}: the steps read and write local folders and s3:// (S3 and S3-compatible "
                "servers); for ADLS or GCS mount the container or use an S3-compatible gateway "
                "(docs/operations.md)"
            )
        try:
            return ObjectPath.parse(text)
        except ValueError as error:
            raise UsageError(str(error)) from None
    return Path(text).resolve()


def _root(variable: str, default: Path) -> Location:
    text = os.environ.get(variable) or ""
    try:
        return as_location(text) if text else default.resolve()
    except UsageError as error:
        raise UsageError(f"{variable}={error}") from None


def local_folder(location: Location, what: str) -> Path:
    """`location` when it is a local folder; UsageError naming `what` when it is object storage."""
    if isinstance(location, ObjectPath):
        raise UsageError(f"{what} is {location}: this needs a local folder")
    return location


def landing_root() -> Location:
    """`CDC_LANDING`, else landing/ under the project root."""
    return _root("CDC_LANDING", project_root() / "landing")


def warehouse_root() -> Location:
    """`CDC_WAREHOUSE`, else warehouse/ under the project root."""
    return _root("CDC_WAREHOUSE", project_root() / "warehouse")


@dataclass(frozen=True)
class TablePaths:
    """The folders of one table: its landing zone and its Delta tables."""

    name: str
    landing_base: Location
    warehouse_base: Location

    @classmethod
    def for_table(
        cls, name: str, landing: Location | None = None, warehouse: Location | None = None
    ) -> TablePaths:
        """Paths under the given roots, or the environment's defaults."""
        return cls(name, landing or landing_root(), warehouse or warehouse_root())

    @property
    def landing(self) -> Location:
        """{landing}/{table}: holds dt=YYYY-MM-DD/hr=HH folders of change files."""
        return self.landing_base / self.name

    @property
    def table_root(self) -> Location:
        """{warehouse}/{table}."""
        return self.warehouse_base / self.name

    @property
    def final(self) -> Location:
        """The current state: latest change per key, deletes removed."""
        return self.table_root / "final"

    @property
    def staging(self) -> Location:
        """Every change not yet compacted away."""
        return self.table_root / "staging"

    @property
    def quarantine(self) -> Location:
        """Rows that cannot be applied, with `_cdc_reason`."""
        return self.table_root / "quarantine"

    @property
    def tombstones(self) -> Location:
        """The latest delete of every deleted key, so older changes never bring it back."""
        return self.table_root / "tombstones"

    @property
    def history(self) -> Location:
        """SCD type 2 versions of every key (tables with history: true)."""
        return self.table_root / "history"

    @property
    def history_log(self) -> Location:
        """Every applied change, by key bucket: what the history versions are cut from."""
        return self.table_root / "history_log"

    @property
    def applied(self) -> Location:
        """One row per staged file version final has applied: the ledger minus these is pending."""
        return self.table_root / "applied"

    @property
    def leases(self) -> Location:
        """Which optimize or reset-staging of the table runs (a Delta log of claims, no rows)."""
        return self.table_root / "leases"

    @property
    def ledger(self) -> Location:
        """One row per staged landing file version (size, mtime, sha256): re-staging adds nothing."""
        return self.table_root / "ledger"
