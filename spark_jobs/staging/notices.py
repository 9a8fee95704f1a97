"""Stage's warning lines on stderr (the summary line stays the one line on stdout)."""

from __future__ import annotations

from collections.abc import Sequence

from cdc_pipeline.config import TableConfig
from cdc_pipeline.intervals import Interval
from spark_jobs import landing
from spark_jobs.landing import LandingFile, Refusal
from spark_jobs.runtime.notices import warn

MAX_LISTED = 10  # entries named in one warning line


def listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def warn_landing(
    table: TableConfig,
    interval: Interval,
    listing: landing.Listing,
    files: landing.FilePlan,
    refusals: Sequence[Refusal],
) -> None:
    """One warning line per kind of landing problem (the summary counts them)."""
    where = f"table {table.name}: {interval}"
    if listing.unrecognised:
        warn(
            f"{where}: not in the landing layout dt=YYYY-MM-DD/hr=HH/*"
            f"{'|'.join(landing.EXTENSIONS[table.file_format])}, never read: "
            + listed(listing.unrecognised)
        )
    if listing.links:
        warn(
            f"{where}: symbolic links refused, never followed: "
            + listed([link.relative for link in listing.links])
        )
    if files.deferred:
        warn(
            f"{where}: files changing while listed, left for the next run: "
            + listed([f.relative for f in files.deferred])
        )
    for refusal in refusals:
        if refusal.source is not None:
            warn(f"{where}: file {refusal.relative} refused (quarantined): {refusal.reason}")


def warn_outside_window(
    table: TableConfig, interval: Interval, outside: Sequence[LandingFile]
) -> None:
    """Files landed in hour folders older than the late-arrival window are never staged silently:
    one warning naming them and the command that applies them."""
    if not outside:
        return
    oldest = min(f.batch for f in outside)
    start = f"{oldest[:10]}T{oldest[11:]}:00:00Z"
    warn(
        f"table {table.name}: {interval}: {len(outside)} file(s) landed in hour folders older than "
        f"the late_arrival_window ({table.late_arrival_window}), not staged: "
        + listed([f.relative for f in outside])
        + f"; apply them with `cdc run {table.name} --start {start} --end "
        f"{interval.end.strftime('%Y-%m-%dT%H:%M:%SZ')}` or widen late_arrival_window"
    )
