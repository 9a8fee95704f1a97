"""The ledger rows of a stage run: one per file version read, per pending file that gave no rows,
and per refused entry, appended after staging and quarantine."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from cdc_pipeline.paths import Location
from spark_jobs import delta, landing
from spark_jobs.rules.transforms import BATCH, FILE
from spark_jobs.staging.plan import StageRows
from spark_jobs.staging.rows import NEWEST


def staged_ledger_rows(rows: StageRows, now: datetime, run_id: str) -> list[dict[str, Any]]:
    """The ledger rows of the versions a crashed run left unrecorded, of the files read (their
    row counts), of the pending files that gave no rows, and of the refusals."""
    plan = rows.plan
    by_ident = {f.ident: f for f in plan.pending}
    ledger_rows = list(rows.recorded)
    ledger_rows += [
        landing.ledger_row(
            by_ident.get((r[BATCH], r[FILE])),
            r[BATCH],
            r[FILE],
            staged=int(r["good"]),
            quarantined=int(r["bad"]),
            refused=None,
            now=now,
            run_id=run_id,
            newest_change=datetime.fromisoformat(r[NEWEST]).replace(tzinfo=UTC)
            if r.get(NEWEST)
            else None,
        )
        for r in rows.per_file
        if (r[BATCH], r[FILE]) in by_ident
    ]
    done = {(r[BATCH], r[FILE]) for r in rows.per_file}
    ledger_rows += [
        landing.ledger_row(
            f, f.batch, f.file, staged=0, quarantined=0, refused=None, now=now, run_id=run_id
        )
        for f in plan.pending
        if f.ident not in done and f.ident not in plan.refused
    ]
    ledger_rows += [
        landing.ledger_row(
            r.source,
            r.batch,
            r.file,
            staged=0,
            quarantined=1,
            refused=r.reason,
            now=now,
            run_id=run_id,
        )
        for r in plan.refusals
    ]
    return ledger_rows


def append_ledger(path: Location, rows: list[dict[str, Any]]) -> None:
    """Append rows to the ledger; an older ledger gains the content columns (merged schema)."""
    delta.append_arrow(path, pa.Table.from_pylist(rows, landing.LEDGER_SCHEMA))
