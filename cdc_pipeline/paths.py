"""Where things live: the repository, the config file, a table's landing files and Delta tables."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cdc_pipeline.errors import UsageError


def project_root() -> Path:
    """The repository root (the folder holding config/ and dags/)."""
    return Path(__file__).resolve().parent.parent


def default_config_path() -> Path:
    """`CDC_CONFIG`, else config/tables.yaml under the project root."""
    env = os.environ.get("CDC_CONFIG")
    return Path(env) if env else project_root() / "config" / "tables.yaml"


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it is under it (as users typed it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _local_root(variable: str, default: Path) -> Path:
    text = os.environ.get(variable) or ""
    if _URI.match(text):
        # Path("s3://b/x") is the local folder "s3:/b/x": refused, never created.
        raise UsageError(
            f"{variable}={text}: the steps keep landing and warehouse on a local or mounted file "
            "system for now (object storage is read and written by Spark and delta-rs, but "
            "landing listing and file adoption are local: docs/operations.md); "
            f"set {variable} to a folder"
        )
    return Path(text or default).resolve()


def landing_root() -> Path:
    """`CDC_LANDING`, else landing/ under the project root."""
    return _local_root("CDC_LANDING", project_root() / "landing")


def warehouse_root() -> Path:
    """`CDC_WAREHOUSE`, else warehouse/ under the project root."""
    return _local_root("CDC_WAREHOUSE", project_root() / "warehouse")


@dataclass(frozen=True)
class TablePaths:
    """The folders of one table: its landing zone and its Delta tables."""

    name: str
    landing_base: Path
    warehouse_base: Path

    @classmethod
    def for_table(
        cls, name: str, landing: Path | None = None, warehouse: Path | None = None
    ) -> TablePaths:
        """Paths under the given roots, or the environment's defaults."""
        return cls(name, Path(landing or landing_root()), Path(warehouse or warehouse_root()))

    @property
    def landing(self) -> Path:
        """{landing}/{table}: holds dt=YYYY-MM-DD/hr=HH folders of change files."""
        return self.landing_base / self.name

    @property
    def table_root(self) -> Path:
        """{warehouse}/{table}."""
        return self.warehouse_base / self.name

    @property
    def final(self) -> Path:
        """The current state: latest change per key, deletes removed."""
        return self.table_root / "final"

    @property
    def staging(self) -> Path:
        """Every change not yet compacted away."""
        return self.table_root / "staging"

    @property
    def quarantine(self) -> Path:
        """Rows that cannot be applied, with `_cdc_reason`."""
        return self.table_root / "quarantine"

    @property
    def tombstones(self) -> Path:
        """The latest delete of every deleted key, so older changes never bring it back."""
        return self.table_root / "tombstones"

    @property
    def history(self) -> Path:
        """SCD type 2 versions of every key (tables with history: true)."""
        return self.table_root / "history"

    @property
    def history_log(self) -> Path:
        """Every applied change, by key bucket: what the history versions are cut from."""
        return self.table_root / "history_log"

    @property
    def applied(self) -> Path:
        """One row per staged file version final has applied: the ledger minus these is pending."""
        return self.table_root / "applied"

    @property
    def ledger(self) -> Path:
        """One row per staged landing file version (size, mtime, sha256): re-staging adds nothing."""
        return self.table_root / "ledger"
