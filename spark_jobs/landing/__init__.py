"""Landing is a boundary: an interval's change files, listed without following links, probed on the
driver, and known to the ledger by content (size, mtime, sha256), not only by name.

By concern: `listing` (the interval's hour folders, links and unrecognised entries refused or
reported), `versions` (a landed file, its re-staged versions and their arrival identities),
`ledger` (the ledger's rows, hashing, what a stage does with the listed files) and `probe`
(Parquet footers against the declared types). The names below are what the steps use, as
`landing.<name>`.
"""

from spark_jobs.landing.ledger import (
    LEDGER_SCHEMA,
    FilePlan,
    Ledger,
    LedgerEntry,
    has_changed,
    ledger_row,
    plan_files,
    read_ledger,
    unknown_before,
    unknown_files,
)
from spark_jobs.landing.listing import Listing, list_landing, listing_interval, spark_path
from spark_jobs.landing.probe import NANOS, ParquetPlan, plan_parquet, probe_parquet
from spark_jobs.landing.versions import (
    EXTENSIONS,
    SYMLINK_REASON,
    LandingFile,
    Refusal,
    is_reserved_name,
    split_version,
    versioned_name,
)

__all__ = [
    "EXTENSIONS",
    "LEDGER_SCHEMA",
    "NANOS",
    "SYMLINK_REASON",
    "FilePlan",
    "LandingFile",
    "Ledger",
    "LedgerEntry",
    "Listing",
    "ParquetPlan",
    "Refusal",
    "has_changed",
    "is_reserved_name",
    "ledger_row",
    "list_landing",
    "listing_interval",
    "plan_files",
    "plan_parquet",
    "probe_parquet",
    "read_ledger",
    "spark_path",
    "split_version",
    "unknown_before",
    "unknown_files",
    "versioned_name",
]
